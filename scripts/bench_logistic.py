"""Seconds per learning iteration of LogisticEnergy (Domke's Algorithm 1) on 16 denoising images of 100 x 100.

    python scripts/bench_logistic.py [--device cuda] [--classes linear/linear mlp/mlp] [--size 100]
                                     [--repeats 3] [--threads 1] [--out scripts/results/bench_logistic.json]

One learning iteration = fit u on all 160k pixels, 25 star-update message passes, fit v on all ~317k edges,
25 passes (eps = .1, the learner's defaults: L-BFGS with 50 iterations for linear functions, 5 SGD passes of
minibatches of 1000 for MLPs). Reported per function-class pair: best wall seconds of --repeats iterations
(after one warm-up), the CPU seconds of that process for the same iteration (the wall time on a shared machine
grows with the load, the CPU time much less), and the share of the 50 message passes in it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from benchutil import timeit, write_results

from structtorch.data import DenoisingDataModule
from structtorch.learners import LogisticEnergy

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--classes", nargs="*", default=["linear/linear", "mlp/mlp"])
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "scripts" / "results" / "bench_logistic.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dm = DenoisingDataModule(height=args.size, width=args.size)
    x, y = (t.to(device) for t in dm.train_tensors)
    index = torch.arange(len(y), device=device)
    rows = []
    for pair in args.classes:
        unary, pairwise = pair.split("/")
        model = LogisticEnergy(dm.num_features, dm.num_labels, **dm.learner_inputs, unary=unary,
                               pairwise=pairwise).to(device)
        steps = iter(range(10**6))

        def iteration() -> None:
            model.strategy.learning_iteration(x, y, index, torch.Generator().manual_seed(next(steps)))

        wall = timeit(iteration, device, args.repeats)
        cpu = time.process_time()
        iteration()
        cpu = time.process_time() - cpu
        messages = model.example_state.get("messages", index).to(device)
        passes = 2 * timeit(lambda: model.strategy.pass_messages(x, y, messages), device, args.repeats)
        rows.append({"classes": pair, "images": f"{len(y)} x {args.size}x{args.size}", "wall_s": round(wall, 3),
                     "cpu_s": round(cpu, 3), "message_passes_s": round(passes, 3)})
        print(rows[-1], flush=True)
    write_results(args.out, rows, device)


if __name__ == "__main__":
    main()
