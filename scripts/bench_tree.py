"""Tree MAP, log Z and marginals on chains: structtorch vs torch-struct's LinearChainCRF, side by side.

    python scripts/bench_tree.py [--device cuda] [--quick] [--repeats 5] [--threads 1] [--compile | --fused]
                                 [--out scripts/results/bench_tree.json]

For every (B, n, K) both libraries get the same chain potentials (float32); times are the best
(min) wall-clock seconds of --repeats calls after a warm-up, ratios are torch-struct / structtorch
(> 1: structtorch is faster). Before timing, MAP scores are cross-checked and both libraries'
marginals are compared with a float64 reference (max absolute error reported). The potentials
are converted to torch-struct's layout once, untimed (input format, not work).

Equal-work rows (both sides build their input object inside the timed call):
  score   MAP score only, under no_grad: ``tree_map(Potentials(...))[0]`` vs ``LinearChainCRF(...).max``.
  logz    log Z and its gradient (the marginals), inputs with requires_grad:
          ``tree_logz(Potentials(...)).sum().backward()`` vs ``LinearChainCRF(...).partition.sum().backward()``.
  map_b / marg_b   the user-level calls with construction: ``tree_map`` / ``tree_marginals`` of a
          fresh ``Potentials`` (validation included) vs ``LinearChainCRF(...).argmax`` / ``.marginals``.
User-level rows as a user calls them with potentials already built:
  map / marg   ``tree_map(pot)`` / ``tree_marginals(pot)`` (under no_grad) vs ``.argmax`` / ``.marginals``
          (torch-struct computes both by autograd through its semiring scan, so it builds a graph).
CPU runs default to one thread (--threads 0: torch's default): stable on a shared machine.

The physical floor, measured in the same run: the copy bandwidth ``bw`` = 2 * bytes / seconds of the best
``dst.copy_(src)`` of two 256 MiB float32 buffers (past the last-level cache; read and write both count),
with the same threads. Per row, the bytes an op must move at the least (potentials read, outputs written):
  map   (B n K + B E K K) * s  +  B * s + B n * 8      (score and the int64 assignment)
  marg  (B n K + B E K K) * s  +  (B n K + B E K K) * s  (unary and pairwise marginals)
with E = n - 1 and s = 4 (float32); achieved bytes/s = bytes / our time, and "x floor" = our time /
(bytes / bw), how many times slower than copying that many bytes (1 = at the floor).

``--compile``: issue #14's rows only, map and marg also with ``inference.backend("compile")`` (torch.compile
of the whole pass per schedule), timed after a first call that compiles (its seconds reported as
``compiled_first_s``, not in the times); written to ``bench_tree_compile.json`` beside --out.
``--fused``: the same with ``inference.backend("fused")`` (the fused C++ kernels of CPU tensors; the first
calls' seconds, ``fused_first_s``, include building them if not cached); written to ``bench_tree_fused.json``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch._dynamo
from benchutil import timeit, write_results

import structtorch as st
from structtorch import inference as inf

try:
    from torch_struct import LinearChainCRF
except ImportError:  # pragma: no cover - optional benchmark dependency
    LinearChainCRF = None

OPS = ("score", "logz", "map_b", "marg_b", "map", "marg")
#: the rows of issue #14's table, timed beside the (B, n, K) grid
ISSUE_SIZES = [(64, 16, 2), (256, 128, 2), (1024, 128, 2), (64, 1024, 2), (256, 128, 8)]
COPY_BYTES = 1 << 28


def copy_bandwidth(device: torch.device, repeats: int) -> float:
    """Bytes/s of the best ``dst.copy_(src)`` of two COPY_BYTES float32 buffers: read + write."""
    src = torch.rand(COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / timeit(lambda: dst.copy_(src), device, repeats)


def traffic(B: int, n: int, K: int, itemsize: int = 4) -> dict:
    """Least bytes moved by MAP and by marginals on a chain: potentials read plus outputs written."""
    potentials = (B * n * K + B * (n - 1) * K * K) * itemsize
    return {"map": potentials + B * itemsize + B * n * 8, "marg": 2 * potentials}


def to_torch_struct(unary: torch.Tensor, pairwise: torch.Tensor) -> torch.Tensor:
    """Chain potentials -> torch-struct log_potentials [B, n-1, K(next), K(prev)]."""
    edge = pairwise.transpose(-1, -2) + unary[:, 1:, :, None]
    edge[:, 0] += unary[:, 0][:, None, :]
    return edge


def check(pot: st.Potentials, edge: torch.Tensor) -> dict:
    """Both libraries' MAP scores and log Z agree; their marginals' max error against a float64 reference."""
    score, _ = inf.tree_map(pot)
    crf = LinearChainCRF(edge)
    assert torch.allclose(score, crf.max, rtol=1e-4, atol=1e-3), (score - crf.max).abs().max()
    assert torch.allclose(inf.tree_logz(pot), crf.partition, rtol=1e-4, atol=1e-3)
    ref = inf.tree_marginals(st.Potentials(pot.unary.double(), pot.pairwise.double(), pot.graph))[0]
    mu, _ = inf.tree_marginals(pot)
    ts_edge_marg = crf.marginals  # [B, n-1, K(next), K(prev)]
    ts_mu = torch.cat([ts_edge_marg[:, :1].sum(-2), ts_edge_marg.sum(-1)], 1)
    return {"marg_err_st": (mu.double() - ref).abs().max().item(),
            "marg_err_ts": (ts_mu.double() - ref).abs().max().item()}


def calls(unary: torch.Tensor, pairwise: torch.Tensor, graph: st.Graph, edge: torch.Tensor) -> dict:
    """op -> (structtorch call, torch-struct call), each doing the same work."""
    pot = st.Potentials(unary, pairwise, graph)
    u_g, p_g, e_g = (t.detach().clone().requires_grad_() for t in (unary, pairwise, edge))

    @torch.no_grad()
    def score_st():
        return inf.tree_map(st.Potentials(unary, pairwise, graph))[0]

    @torch.no_grad()
    def score_ts():
        return LinearChainCRF(edge).max

    @torch.no_grad()
    def map_st():
        return inf.tree_map(pot)

    @torch.no_grad()
    def marg_st():
        return inf.tree_marginals(pot)

    return {
        "score": (score_st, score_ts),
        "logz": (lambda: inf.tree_logz(st.Potentials(u_g, p_g, graph)).sum().backward(),
                 lambda: LinearChainCRF(e_g).partition.sum().backward()),
        "map_b": (lambda: inf.tree_map(st.Potentials(unary, pairwise, graph)), lambda: LinearChainCRF(edge).argmax),
        "marg_b": (lambda: inf.tree_marginals(st.Potentials(unary, pairwise, graph)),
                   lambda: LinearChainCRF(edge).marginals),
        "map": (map_st, lambda: LinearChainCRF(edge).argmax),
        "marg": (marg_st, lambda: LinearChainCRF(edge).marginals),
    }


#: opt-in variants of the passes: --compile and --fused time map and marg again on these backends
VARIANTS = {"compiled": "compile", "fused": "fused"}


def variant_times(row: dict, name: str, ours: dict, device: torch.device, repeats: int, bandwidth: float) -> None:
    """map / marg with VARIANTS[name] on into row: the first calls' seconds (compilation), times, ratios, x floor."""
    with inf.backend(VARIANTS[name]):
        t = time.perf_counter()
        for op in ("map", "marg"):
            ours[op]()
        row[f"{name}_first_s"] = time.perf_counter() - t
        for op in ("map", "marg"):
            row[f"{op}_{name}_st"] = timeit(ours[op], device, repeats)
            row[f"{op}_{name}_ratio"] = row[f"{op}_ts"] / row[f"{op}_{name}_st"]
            row[f"{op}_{name}_floor_x"] = bandwidth * row[f"{op}_{name}_st"] / row[f"{op}_bytes"]


def variant_summary(row: dict, name: str) -> str:
    return (f" | {name} {row[f'{name}_first_s']:5.1f} s: {row[f'map_{name}_ratio']:6.2f}x"
            f" {row[f'marg_{name}_ratio']:6.2f}x, floor x {row[f'map_{name}_floor_x']:4.0f}"
            f" {row[f'marg_{name}_floor_x']:4.0f}")


def run(device: torch.device, sizes: list[tuple[int, int, int]], repeats: int, bandwidth: float,
        variant: str | None = None) -> list[dict]:
    rows = []
    for B, n, K in sizes:
        gen = torch.Generator().manual_seed(0)
        unary = torch.randn(B, n, K, generator=gen).to(device)
        pairwise = torch.randn(B, n - 1, K, K, generator=gen).to(device)
        graph = st.Graph.chain(n)
        edge = to_torch_struct(unary, pairwise)
        row = {"B": B, "n": n, "K": K, **check(st.Potentials(unary, pairwise, graph), edge)}
        fns = calls(unary, pairwise, graph, edge)
        for op, (ours, theirs) in fns.items():
            row[f"{op}_st"] = timeit(ours, device, repeats)
            row[f"{op}_ts"] = timeit(theirs, device, repeats)
            row[f"{op}_ratio"] = row[f"{op}_ts"] / row[f"{op}_st"]
        for op, nbytes in traffic(B, n, K).items():
            row[f"{op}_bytes"] = nbytes
            row[f"{op}_bytes_per_s"] = nbytes / row[f"{op}_st"]
            row[f"{op}_floor_x"] = bandwidth / row[f"{op}_bytes_per_s"]
        if variant:
            variant_times(row, variant, {op: fns[op][0] for op in ("map", "marg")}, device, repeats, bandwidth)
        rows.append(row)
        print(f"{B:>5} {n:>5} {K:>2} | " + " ".join(f"{row[f'{op}_ratio']:7.2f}" for op in OPS)
              + f" | {row['map_st'] * 1e3:8.2f} {row['marg_st'] * 1e3:8.2f}"
              + f" | {row['map_bytes_per_s'] / 1e9:6.3f} {row['marg_bytes_per_s'] / 1e9:6.3f}"
              + f" | {row['map_floor_x']:7.0f} {row['marg_floor_x']:7.0f}"
              + f" | {row['marg_err_st']:.1e} {row['marg_err_ts']:.1e}"
              + (variant_summary(row, variant) if variant else ""), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    variant = ap.add_mutually_exclusive_group()
    variant.add_argument("--compile", action="store_true",
                         help="issue #14's rows, also on the compile backend")
    variant.add_argument("--fused", action="store_true", help="issue #14's rows, also on the fused backend")
    ap.add_argument("--out", default="scripts/results/bench_tree.json")
    args = ap.parse_args()
    if LinearChainCRF is None:
        raise SystemExit("torch-struct is needed: pip install --no-deps torch-struct (the [bench] extra)")
    warnings.filterwarnings("ignore", message=".*arg_constraints")  # torch-struct's distributions
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    Bs, ns, Ks = ([1, 64], [16, 128], [2]) if args.quick else ([1, 64, 1024], [16, 128, 1024], [2, 8])
    sizes = [(B, n, K) for B in Bs for n in ns for K in Ks]
    sizes += [] if args.quick else [s for s in ISSUE_SIZES if s not in sizes]
    name = "compiled" if args.compile else "fused" if args.fused else None
    if name:
        torch._dynamo.config.recompile_limit = 64  # every row's schedule compiles its own program
        sizes = ISSUE_SIZES
    print(f"device={device} torch={torch.__version__} threads={torch.get_num_threads()} repeats={args.repeats}")
    bandwidth = copy_bandwidth(device, args.repeats)
    print(f"copy bandwidth (the floor): {bandwidth / 1e9:.2f} GB/s (read + write, {COPY_BYTES >> 20} MiB buffers)")
    print("    B     n  K | ratio torch-struct / structtorch: " + " ".join(f"{op:>7}" for op in OPS)
          + " | ms ours:  map     marg | GB/s: map   marg | x floor: map   marg"
          + " | marginal error vs float64: ours torch-struct")
    rows = run(device, sizes, args.repeats, bandwidth, name)
    print("\nissue #14 rows (torch-struct / structtorch; x above the copy floor):")
    print("    B     n  K |     map    marg | floor x: map    marg")
    for row in rows:
        if (row["B"], row["n"], row["K"]) in ISSUE_SIZES:
            print(f"{row['B']:>5} {row['n']:>5} {row['K']:>2} | {row['map_ratio']:6.2f}x {row['marg_ratio']:6.2f}x"
                  f" | {row['map_floor_x']:10.0f} {row['marg_floor_x']:7.0f}"
                  + (variant_summary(row, name) if name else ""))
    out = args.out.replace(".json", {"compiled": "_compile.json", "fused": "_fused.json"}.get(name, ".json"))
    write_results(out, rows, device, repeats=args.repeats, dtype="float32", copy_bytes_per_s=bandwidth)


if __name__ == "__main__":
    main()
