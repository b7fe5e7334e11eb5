"""glibc's default malloc vs ``allocator.reuse_large_blocks`` (what ``train.run`` sets), side by side.

    python scripts/bench_allocator.py [--rows 11628] [--labels 983] [--features 500] [--steps 10] [--repeats 3]
                                      [--out scripts/results/bench_allocator.json]

Each side is a fresh subprocess doing the same work on the same synthetic data (``sparse_multilabel``, delicious's
training shape by default: 11,628 rows, 500 sparse binary features, 983 labels): FixedTree's energy on a random
spanning tree, float64, the fused tree kernels; it times one objective + gradient of ``SmoothedLBFGS`` (best of
--repeats after a warm-up) and --steps L-BFGS iterations, and reports its peak resident memory. The sides alternate
--repeats times; the table shows each side's best and the ratio default / reuse (> 1: reuse is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from benchutil import timeit, write_results

REPO = Path(__file__).resolve().parents[1]
SIDES = ("default", "reuse")


def measure(side: str, rows: int, labels: int, features: int, steps: int, repeats: int) -> dict:
    """One side's timings in this process (``--side``): seconds of an objective + gradient and of ``steps`` L-BFGS
    iterations, peak resident MB."""
    from structtorch.allocator import reuse_large_blocks
    from structtorch.data import sparse_multilabel
    from structtorch.energies import FinleyJoachimsEnergy
    from structtorch.graph import Graph
    from structtorch.inference import set_backend
    from structtorch.solvers import SmoothedLBFGS
    from structtorch.structure import random_spanning_trees

    if side == "reuse" and not reuse_large_blocks():
        raise SystemExit("reuse_large_blocks() is not available here (it needs glibc's mallopt)")
    set_backend("fused")
    x, y = sparse_multilabel(rows, features, labels, seed=0)
    x = x.double()
    x = (x - x.mean(0)) / x.std(0).clamp_min(1e-6)
    tree = random_spanning_trees(labels, 1, generator=torch.Generator().manual_seed(0))
    energy = FinleyJoachimsEnergy(features, labels, graph=Graph(labels, tree.edges.reshape(-1, 2)), spin=True)
    solver = SmoothedLBFGS(energy.double(), x, y, 1.0 / rows)

    # the solver's own evaluation: its streamed terms, each chunk's graph freed before the next
    gradient_s = timeit(lambda: solver.opt.slices.value_and_grad(solver.objective), torch.device("cpu"), repeats)
    start = time.perf_counter()
    solver.run(steps)
    steps_s = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"side": side, "gradient_s": gradient_s, "steps_s": steps_s, "peak_mb": peak_mb}


def run_side(side: str, args: argparse.Namespace) -> dict:
    """``measure`` in a fresh subprocess (malloc's settings are per process), without the variables that turn
    ``reuse_large_blocks`` off (glibc's MALLOC_ ones, STRUCTTORCH_REUSE_MEMORY)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "STRUCTTORCH_REUSE_MEMORY"}
    cmd = [sys.executable, __file__, "--side", side, "--rows", str(args.rows), "--labels", str(args.labels),
           "--features", str(args.features), "--steps", str(args.steps), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=11628)
    parser.add_argument("--labels", type=int, default=983)
    parser.add_argument("--features", type=int, default=500)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(REPO / "scripts" / "results" / "bench_allocator.json"))
    args = parser.parse_args()
    if args.side:
        print(json.dumps(measure(args.side, args.rows, args.labels, args.features, args.steps, args.repeats)))
        return
    runs = [run_side(side, args) for _ in range(args.repeats) for side in SIDES]
    best = {side: {k: min(r[k] for r in runs if r["side"] == side) for k in ("gradient_s", "steps_s", "peak_mb")}
            for side in SIDES}
    print(f"{'':>10} {'objective+grad s':>17} {f'{args.steps} L-BFGS steps s':>20} {'peak MB':>8}")
    for side in SIDES:
        b = best[side]
        print(f"{side:>10} {b['gradient_s']:17.3f} {b['steps_s']:20.2f} {b['peak_mb']:8.0f}")
    ratio = {k: best["default"][k] / best["reuse"][k] for k in ("gradient_s", "steps_s", "peak_mb")}
    print(f"{'ratio':>10} {ratio['gradient_s']:17.2f} {ratio['steps_s']:20.2f} {ratio['peak_mb']:8.2f}"
          "  (default / reuse)")
    write_results(args.out, runs, torch.device("cpu"), sections={"best": best, "ratio": ratio},
                  shape={"rows": args.rows, "labels": args.labels, "features": args.features}, steps=args.steps)


if __name__ == "__main__":
    main()
