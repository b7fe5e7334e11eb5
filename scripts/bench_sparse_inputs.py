"""An L-BFGS evaluation of the certified M3N and tree-CRF objectives on sparse rows: dense stored rows against
``SparseInputs`` (products through the nonzeros of z = x - c).

    python scripts/bench_sparse_inputs.py [--shapes delicious bookmarks rcv1subset] [--repeats 3]
                                          [--out scripts/results/bench_sparse_inputs.json]

Each shape is random binary features at its density, standardised as the data module does (so dense, each
column's zeros turned into one constant), with labels from a random linear model:

- delicious: 11,628 x 500 at 3.7% nonzeros, 983 labels;
- bookmarks: 55,349 x 2,150 at 0.6%, 208 labels;
- rcv1subset: 2,700 x 47,236 at 0.15%, 101 labels.

Two energies on a random spanning tree: FixedTree's (``FinleyJoachimsEnergy``, the smoothed hinge) and TreeCRF's
(``LocalLinearEnergy`` with 10 inputs a label, the likelihood). Each side times the same work, one evaluation of
``SmoothedLBFGS``'s objective and its gradient over every row (best of --repeats after a warm-up), at the same
parameters, in the precision L-BFGS takes there (``lbfgs_dtype``): the solver built on the dense rows as before
(``SPARSE_PRODUCT_DENSITY`` set to 0) and on the same rows as the energy stores them now. The objectives agree to
float rounding (``max_rel_diff``). Building each solver (which stores its rows, once per solve) is timed apart
(``store_s``). Ratio: dense / sparse (> 1: the sparse rows are faster).

``products``: the unary product alone, x w^T and its gradient in w (w [983, 500], 4,300 rows: one chunk of
delicious' rows) at densities of z around ``SPARSE_PRODUCT_DENSITY``, dense against ``SparseInputs.linear``: where
the sparse product stops paying.
"""

from __future__ import annotations

import argparse
import time

import torch
from benchutil import timeit, write_results

from structtorch import inputs
from structtorch.energies import FinleyJoachimsEnergy, LocalLinearEnergy
from structtorch.graph import Graph
from structtorch.solvers import SmoothedLBFGS
from structtorch.strategies.certified import lbfgs_dtype
from structtorch.structure import random_spanning_trees

SHAPES = {"delicious": (11628, 500, 983, 0.037), "bookmarks": (55349, 2150, 208, 0.006),
          "rcv1subset": (2700, 47236, 101, 0.0015)}


def problem(shape: str) -> tuple[torch.Tensor, torch.Tensor, Graph]:
    """Standardised rows x [N, D], labels y [N, n] and a random spanning tree of ``shape``."""
    N, D, n, density = SHAPES[shape]
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(N, D, generator=g) < density).float()
    w = torch.randn(D, n, generator=g)
    scores = x @ w
    y = (scores > scores.quantile(0.98, dim=0)).long()  # about 2% of the rows positive per label
    x = (x - x.mean(0)) / x.std(0).clamp(min=1e-8)
    return x, y, Graph(n, random_spanning_trees(n, 1, g).edges[0])


def energies(D: int, tree: Graph) -> dict:
    """The two energies with random parameters: (energy, crf) by name."""
    g = torch.Generator().manual_seed(1)
    fixed_tree = FinleyJoachimsEnergy(D, tree.num_nodes, tree, spin=True)
    tree_crf = LocalLinearEnergy(D, tree.num_nodes, 10, 2, tree)
    tree_crf.set_inputs([torch.randperm(D, generator=g)[:10].tolist() for _ in range(tree.num_nodes)])
    for energy in (fixed_tree, tree_crf):
        with torch.no_grad():
            for p in energy.parameters():
                p.normal_(std=0.01, generator=g)
    return {"fixed_tree": (fixed_tree, False), "tree_crf": (tree_crf, True)}


def solver(energy, x: torch.Tensor, y: torch.Tensor, crf: bool, dense: bool) -> tuple[SmoothedLBFGS, float]:
    """The solver of ``energy``'s objective on x, y (rows stored dense with ``dense``) and the seconds it took."""
    saved = inputs.SPARSE_PRODUCT_DENSITY
    inputs.SPARSE_PRODUCT_DENSITY = 0.0 if dense else saved
    try:
        start = time.perf_counter()
        s = SmoothedLBFGS(energy, x, y, 1e-3, margin_scale=0.0 if crf else 1.0, eps=1.0 if crf else None,
                          dtype=lbfgs_dtype(len(x), energy.graph))
        return s, time.perf_counter() - start
    finally:
        inputs.SPARSE_PRODUCT_DENSITY = saved


def evaluation(s: SmoothedLBFGS) -> float:
    """One objective and gradient over every row; the objective."""
    for p in s.params:
        p.grad = None
    terms = s.objective()
    value = terms if torch.is_tensor(terms) else sum(terms)
    value.sum().backward()
    return float(value.detach().sum())


def products(densities: tuple[float, ...], repeats: int) -> list[dict]:
    """The unary product's forward and backward, dense rows against ``SparseInputs``, at each density of z."""
    g, rows = torch.Generator().manual_seed(2), []
    for density in densities:
        x = (torch.rand(4300, 500, generator=g) < density).float()
        x = (x - x.mean(0)) / x.std(0).clamp(min=1e-8)
        sparse = inputs.SparseInputs(*inputs.sparse_rows(x, 1.0))
        w = torch.randn(983, 500, generator=g, requires_grad=True)
        grad = torch.randn(4300, 983, generator=g)
        sides = {"dense": lambda: x @ w.T, "sparse": lambda: sparse.linear(w)}
        times = {side: timeit(lambda f=f: torch.autograd.grad(f(), w, grad), torch.device("cpu"), repeats)
                 for side, f in sides.items()}
        row = {"density": density, **{f"{side}_s": t for side, t in times.items()},
               "ratio": times["dense"] / times["sparse"]}
        rows.append(row)
        print(f"product at {density:.1%} nonzeros: dense {row['dense_s']:.3f} s, sparse {row['sparse_s']:.3f} s "
              f"(dense / sparse {row['ratio']:.2f}x)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="scripts/results/bench_sparse_inputs.json")
    args = ap.parse_args()
    cpu, rows = torch.device("cpu"), []
    for shape in args.shapes:
        x, y, tree = problem(shape)
        for name, (energy, crf) in energies(x.shape[1], tree).items():
            sides = {side: solver(energy, x, y, crf, side == "dense") for side in ("dense", "sparse")}
            assert isinstance(sides["sparse"][0].x, inputs.SparseInputs), "the rows were not stored sparse"
            values = {side: evaluation(s) for side, (s, _) in sides.items()}
            times = {side: timeit(lambda s=s: evaluation(s), cpu, args.repeats) for side, (s, _) in sides.items()}
            row = {"shape": shape, "energy": name, "dtype": str(sides["dense"][0].x.dtype),
                   **{f"{side}_s": t for side, t in times.items()},
                   **{f"{side}_store_s": sides[side][1] for side in sides},
                   "ratio": times["dense"] / times["sparse"],
                   "max_rel_diff": abs(values["dense"] - values["sparse"]) / max(abs(values["dense"]), 1e-30)}
            rows.append(row)
            print(f"{shape:>10} {name:>10}: dense {row['dense_s']:.3f} s, sparse {row['sparse_s']:.3f} s "
                  f"(dense / sparse {row['ratio']:.2f}x; stored in {row['dense_store_s']:.2f} / "
                  f"{row['sparse_store_s']:.2f} s; objectives' relative difference {row['max_rel_diff']:.1e})")
    sweep = products((0.02, 0.037, 0.05, 0.08, 0.1, 0.2), args.repeats)
    write_results(args.out, rows, cpu, sections={"products": sweep}, repeats=args.repeats,
                  shapes={s: SHAPES[s] for s in args.shapes})


if __name__ == "__main__":
    main()
