"""``LocalLinearEnergy`` on its inputs as loaded (row-major), column-major, and as a solver stores them
(``stored_inputs``).

    python scripts/bench_local_linear.py [--rows 55349] [--features 2150] [--labels 208] [--inputs 10]
                                         [--repeats 3] [--out scripts/results/bench_local_linear.json]

The energy is TreeCRF's (every unary on all D columns, each edge on its labels' 2k input columns) on a random tree,
in float32, on sparse standardised rows (0.6% nonzeros; bookmarks' training shape by default). Each side times the
same work, the forward pass over all rows and the backward of a scalar of the potentials (best of --repeats after a
warm-up), on the same values: x as the data module gives it (row-major), x column-major (what ``stored_inputs``
returned until rows sparse up to a constant row were stored as ``SparseInputs``: the edges' columns are gathered
from contiguous rows), and ``energy.stored_inputs(x)`` (here ``SparseInputs``: the unary product and the edges'
tables through the nonzeros, what ``SmoothedHinge`` holds for the whole fit). Storing the rows and gathering the
edges' columns of their nonzeros (``SparseInputs.gathered``) are done once per solve and timed apart
(``stored_copy_s``). Ratios: row-major / stored and column-major / stored (> 1: the stored rows are faster).
"""

from __future__ import annotations

import argparse
import time

import torch
from benchutil import timeit, write_results

from structtorch.energies import LocalLinearEnergy
from structtorch.graph import Graph
from structtorch.inputs import SparseInputs
from structtorch.structure import random_spanning_trees


def setup(rows: int, features: int, labels: int, inputs: int) -> tuple[LocalLinearEnergy, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    density = 0.006
    x = ((torch.rand(rows, features, generator=g) < density).float() - density) / density ** 0.5
    tree = Graph(labels, random_spanning_trees(labels, 1, g).edges[0])
    energy = LocalLinearEnergy(features, labels, inputs, 2, tree)
    energy.set_inputs([torch.randperm(features, generator=g)[:inputs].tolist() for _ in range(labels)])
    with torch.no_grad():
        for p in energy.parameters():
            p.normal_(generator=g)
    return energy, x


def forward_backward(energy: LocalLinearEnergy, x: torch.Tensor) -> None:
    pot = energy(x)
    (pot.unary.square().sum() + pot.pairwise.square().sum()).backward()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=55349)
    ap.add_argument("--features", type=int, default=2150)
    ap.add_argument("--labels", type=int, default=208)
    ap.add_argument("--inputs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="scripts/results/bench_local_linear.json")
    args = ap.parse_args()
    energy, x = setup(args.rows, args.features, args.labels, args.inputs)
    start = time.perf_counter()
    stored = energy.stored_inputs(x)
    if isinstance(stored, SparseInputs):
        stored.gathered(energy.pair_inputs)
    copy_s = time.perf_counter() - start
    cpu = torch.device("cpu")
    sides = {"row-major": x, "column-major": x.T.contiguous().T, "stored": stored}
    rows = [{"side": side, "forward_backward_s": timeit(lambda v=v: forward_backward(energy, v), cpu, args.repeats)}
            for side, v in sides.items()]
    times = {row["side"]: row["forward_backward_s"] for row in rows}
    ratios = {f"{side} / stored": times[side] / times["stored"] for side in ("row-major", "column-major")}
    for row in rows:
        print(f"{row['side']:>12}: forward + backward {row['forward_backward_s']:.3f} s")
    print("; ".join(f"{name}: {r:.2f}x" for name, r in ratios.items()) + f"; stored as {type(stored).__name__} "
          f"(once per solve): {copy_s:.3f} s")
    shape = {"N": args.rows, "D": args.features, "n": args.labels, "k": args.inputs, "repeats": args.repeats}
    write_results(args.out, rows, cpu, ratios=ratios, stored=type(stored).__name__, stored_copy_s=copy_s, **shape)


if __name__ == "__main__":
    main()
