"""Where the time of the two structure steps goes at delicious's size, on the CPU and on a CUDA GPU side by side.

- TreeCRF: the input mapping (``select_inputs``) and the first batches of the edge-score regressions
  (``edge_scores``, ``model.score_rows`` = 2000 rows, the candidate graph of 10 partners per label).
- CRANK: its forest refit (``train_forests``, on the CPU in a GPU run too) on a maximum spanning tree of the labels'
  mutual information, every training row, a fixed number of L-BFGS iterations, on the fused and the eager passes.

Each step is timed (synchronised) and its top operators by self time are printed (``torch.profiler``).

    python scripts/profile_structure.py --out scripts/results/profile_structure.json [--devices cpu cuda] [--top 0]
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from structtorch.data.mulan import load_mulan
from structtorch.estimation import edge_scores, select_inputs
from structtorch.folds import rows_at_most
from structtorch.graph import Graph
from structtorch.inference import backend
from structtorch.learners.baselines import train_forests
from structtorch.structure import candidate_graph, max_spanning_tree
from structtorch.structure.edge_scores import mutual_information_matrix


def timed(fn, device: str, top: int, label: str) -> tuple[float, object]:
    """(seconds, result) of fn(), with the top operators by self time printed (none, and no profiler, at top 0)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) if top else nullcontext() as prof:
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    print(f"\n##### {label} on {device}: {seconds:.2f} s", flush=True)
    if top:
        key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=60))
    return seconds, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", nargs="+", default=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    ap.add_argument("--pairs", type=int, default=256, help="label pairs scored (the most dependent first)")
    ap.add_argument("--iterations", type=int, default=3, help="L-BFGS iterations of the forest refit")
    ap.add_argument("--top", type=int, default=12, help="operators printed per step (0: no profiler)")
    ap.add_argument("--refit", type=int, default=1, help="0: leave out CRANK's refit")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    x, y, _, _ = load_mulan("delicious", "train", progress=False)
    xs, ys, _ = rows_at_most(x, y, 2000, "score_rows")
    graph = candidate_graph(ys, 10)
    tree = max_spanning_tree(mutual_information_matrix(y, 2)[tuple(graph.edges.T)], graph)
    rows = []
    for device in args.devices:
        xd, yd = xs.to(device), ys.to(device)
        t_inputs, inputs = timed(lambda: select_inputs(xd, yd, 10), device, args.top, "TreeCRF input mapping")
        sub = Graph.from_mask(torch.arange(graph.num_edges) < args.pairs, graph)
        t_scores, _ = timed(lambda: edge_scores(xd, yd, "dci", inputs=inputs, graph=sub), device, args.top,
                            f"TreeCRF edge scores of {sub.num_edges} pairs")
        rows.append({"step": "tree_crf_inputs", "device": device, "seconds": t_inputs})
        rows.append({"step": "tree_crf_edge_scores", "device": device, "pairs": sub.num_edges, "seconds": t_scores})
    xf, yf = x.to(torch.float64), y
    for mode in ("fused", "eager") if args.refit else ():  # CRANK refits on the CPU, in a GPU run too
        with backend(mode):
            t_refit, _ = timed(lambda: train_forests(xf, yf, tree[None], 1e-2 / len(x), graph=graph,
                                                     iterations=args.iterations), "cpu", args.top,
                               f"CRANK forest refit ({args.iterations} iterations, {mode})")
        rows.append({"step": "crank_refit", "device": "cpu", "backend": mode, "iterations": args.iterations,
                     "threads": torch.get_num_threads(), "seconds": t_refit})
    print(json.dumps(rows, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name() if "cuda" in args.devices else "cpu",
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
