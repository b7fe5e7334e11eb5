"""A CRF's certified L-BFGS fit with and without the certificates' block steps on the biases, side by side.

    .venv/bin/python scripts/bench_crf_moves.py [--dataset delicious] [--rows 1000] [--max-iter 200]
                                                [--out scripts/results/bench_crf_moves.json]

A tree CRF (``LocalLinearEnergy``: 10 input columns a label by ``select_inputs``, a random spanning tree of the
labels, seed 0) on the first ``--rows`` training rows of a Mulan set (standardised), lambda 200 / N, bias_reg 1e-4,
float64, one thread, fitted to the relative gap 1e-3 with a certificate every 20 iterations (``SmoothedLBFGS.fit``)
in three ways, the same problem each time:

  none          no block steps (``BIAS_MOVE_ELEMENTS`` = 0: L-BFGS and its certificates alone)
  labels        the labels' biases moved at each certificate (``PAIR_MOVE_ELEMENTS`` = 0)
  labels+edges  the labels' biases, then the edges' (the default)

Reported: iterations and seconds to the certificate (or to ``--max-iter``), the final gap and objective, and each
one's seconds against ``none``'s.
"""

from __future__ import annotations

import argparse
import time

import torch
from benchutil import write_results
from threadpoolctl import threadpool_limits

from structtorch import Graph
from structtorch.data import Standardizer, load_mulan
from structtorch.energies import LocalLinearEnergy
from structtorch.estimation import select_inputs
from structtorch.solvers import smoothing
from structtorch.structure import random_spanning_trees

VARIANTS = {"none": {"BIAS_MOVE_ELEMENTS": 0}, "labels": {"PAIR_MOVE_ELEMENTS": 0}, "labels+edges": {}}


def fit(x: torch.Tensor, y: torch.Tensor, graph: Graph, inputs: list[list[int]], limits: dict, max_iter: int) -> dict:
    """One certified fit with the module limits ``limits`` set for it; its iterations, seconds, gap, objective."""
    saved = {k: getattr(smoothing, k) for k in limits}
    for k, v in limits.items():
        setattr(smoothing, k, v)
    try:
        energy = LocalLinearEnergy(x.shape[1], y.shape[1], 10, 2, graph).double()
        energy.set_inputs(inputs)
        solver = smoothing.SmoothedLBFGS(energy, x, y, 200.0 / len(x), margin_scale=0.0, eps=1.0, bias_reg=1e-4,
                                         tol=1e-3)
        t = time.perf_counter()
        info = solver.fit(max_iter=max_iter, check_every=20)
        seconds = time.perf_counter() - t
    finally:
        for k, v in saved.items():
            setattr(smoothing, k, v)
    return {"iterations": solver.iterations, "seconds": round(seconds, 1), "certified": bool(info.converged.all()),
            "relative_gap": float(info.relative_gap.max()), "objective": float(info.primal.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="delicious")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--max-iter", type=int, default=200)
    ap.add_argument("--out", default="scripts/results/bench_crf_moves.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    x, y = load_mulan(args.dataset, "train")[:2]
    x, y = Standardizer.fit(x).transform(x)[: args.rows].double(), y[: args.rows]
    graph = Graph(y.shape[1], random_spanning_trees(y.shape[1], 1, torch.Generator().manual_seed(0)).edges[0])
    with threadpool_limits(1), torch.no_grad():
        torch.set_num_threads(1)
        inputs = select_inputs(x.float(), y, 10)
    rows = []
    with threadpool_limits(1):
        for name, limits in VARIANTS.items():
            row = {"variant": name, **fit(x, y, graph, inputs, limits, args.max_iter)}
            rows.append(row)
            print(row, flush=True)
    base = rows[0]["seconds"]
    for row in rows:
        row["seconds_vs_none"] = round(row["seconds"] / base, 2)
        print(f"{row['variant']:>13}: {row['iterations']} iterations, {row['seconds']} s "
              f"({row['seconds_vs_none']}x none's), gap {row['relative_gap']:.2g}, objective {row['objective']:.6f}")
    write_results(args.out, rows, torch.device("cpu"), dataset=args.dataset, num_rows=len(x), max_iter=args.max_iter)


if __name__ == "__main__":
    main()
