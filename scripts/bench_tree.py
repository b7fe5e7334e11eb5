"""Tree MAP and marginals on chains: structtorch vs torch-struct's LinearChainCRF, side by side.

    python scripts/bench_tree.py [--device cuda] [--quick] [--out scripts/results/bench_tree.json]

For every (B, n, K) both libraries get the same chain potentials (float32); the table shows
median wall-clock seconds over repeats and the ratio torch-struct / structtorch (> 1: we are
faster). Before timing, MAP scores are cross-checked and both libraries' marginals are compared
with a float64 reference (max absolute error reported).
"""

from __future__ import annotations

import argparse

import torch
from benchutil import timeit, write_results

import structtorch as st
from structtorch import inference as inf

try:
    from torch_struct import LinearChainCRF
except ImportError:  # pragma: no cover - optional benchmark dependency
    LinearChainCRF = None


def to_torch_struct(unary: torch.Tensor, pairwise: torch.Tensor) -> torch.Tensor:
    """Chain potentials -> torch-struct log_potentials [B, n-1, K(next), K(prev)]."""
    edge = pairwise.transpose(-1, -2) + unary[:, 1:, :, None]
    edge[:, 0] += unary[:, 0][:, None, :]
    return edge


def check(pot: st.Potentials, edge: torch.Tensor) -> dict:
    """Both libraries' MAP scores agree; their marginals' max error against a float64 reference."""
    score, _ = inf.tree_map(pot)
    crf = LinearChainCRF(edge)
    assert torch.allclose(score, crf.max, rtol=1e-4, atol=1e-3), (score - crf.max).abs().max()
    ref = inf.tree_marginals(st.Potentials(pot.unary.double(), pot.pairwise.double(), pot.graph))[0]
    mu, _ = inf.tree_marginals(pot)
    ts_edge_marg = crf.marginals  # [B, n-1, K(next), K(prev)]
    ts_mu = torch.cat([ts_edge_marg[:, :1].sum(-2), ts_edge_marg.sum(-1)], 1)
    return {"marg_err_st": (mu.double() - ref).abs().max().item(),
            "marg_err_ts": (ts_mu.double() - ref).abs().max().item()}


def run(device: torch.device, sizes: list[tuple[int, int, int]], repeats: int) -> list[dict]:
    rows = []
    for B, n, K in sizes:
        gen = torch.Generator().manual_seed(0)
        unary = torch.randn(B, n, K, generator=gen).to(device)
        pairwise = torch.randn(B, n - 1, K, K, generator=gen).to(device)
        graph = st.Graph.chain(n)
        pot = st.Potentials(unary, pairwise, graph)
        edge = to_torch_struct(unary, pairwise)
        row = {"B": B, "n": n, "K": K, **check(pot, edge)}
        with torch.no_grad():
            row["map_st"] = timeit(lambda: inf.tree_map(pot), device, repeats)
            row["marg_st"] = timeit(lambda: inf.tree_marginals(pot), device, repeats)
        row["map_ts"] = timeit(lambda: LinearChainCRF(edge).argmax, device, repeats)
        row["marg_ts"] = timeit(lambda: LinearChainCRF(edge).marginals, device, repeats)
        row["map_ratio"] = row["map_ts"] / row["map_st"]
        row["marg_ratio"] = row["marg_ts"] / row["marg_st"]
        rows.append(row)
        print(f"{B:>5} {n:>5} {K:>2} | map {row['map_st']:9.5f} {row['map_ts']:9.5f} {row['map_ratio']:6.2f}x"
              f" | marginals {row['marg_st']:9.5f} {row['marg_ts']:9.5f} {row['marg_ratio']:6.2f}x"
              f" | err vs f64 {row['marg_err_st']:.1e} {row['marg_err_ts']:.1e}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    ap.add_argument("--out", default="scripts/results/bench_tree.json")
    args = ap.parse_args()
    if LinearChainCRF is None:
        raise SystemExit("torch-struct is needed: pip install --no-deps torch-struct (the [bench] extra)")
    device = torch.device(args.device)
    Bs, ns, Ks = ([1, 64], [16, 128], [2]) if args.quick else ([1, 64, 1024], [16, 128, 1024], [2, 8])
    sizes = [(B, n, K) for B in Bs for n in ns for K in Ks]
    print(f"device={device} torch={torch.__version__} threads={torch.get_num_threads()}")
    print("    B     n  K | map: structtorch  torch-struct  ratio | marginals: structtorch  torch-struct  ratio"
          " | marginal error vs float64: structtorch torch-struct")
    rows = run(device, sizes, args.repeats)
    write_results(args.out, rows, device)


if __name__ == "__main__":
    main()
