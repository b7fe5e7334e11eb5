"""Smoothed LP message passing (batched) vs the exact LP (scipy HiGHS, one example at a time).

    python scripts/bench_smoothed.py [--device cuda] [--iters 100] [--eps-scale 0.03]
                                     [--coupling 2.0] [--threads 1] [--quick]
                                     [--out scripts/results/bench_smoothed.json]

Complete graphs, n in {6, 14, 50, 200}, K = 2, CRANK-style random potentials: unary ~ N(0, 1),
pairwise[e, 1, 1] = w_e ~ N(0, (coupling / (n - 1))^2), other pairwise entries 0 (the
1/(n-1) scaling keeps each node's total coupling O(1), so the LP stays mostly tight and
decoded assignments are comparable). eps = eps_scale / (n - 1) (a fixed ratio to the coupling
scale). smoothed_lp runs a fixed number of sweeps (--iters, no tol) on a batch of B = 64;
per-example time = batch time / 64 (median of --repeats calls after a 1-sweep warm-up that
builds the colouring). lp_map solves the first L examples of the same batch one by one
(L = 64, 64, 16, 4 for n = 6, 14, 50, 200: HiGHS needs seconds per example at n = 200);
agreement and value gaps are measured on those L examples.

Reported: ms per example for both, the LP / smoothed time ratio (> 1: smoothed is faster),
the fraction of examples whose whole decoded assignment equals lp_map's, the node-level
agreement, the fraction of fractional LP nodes (|mu - 1/2| < 0.49; argmax of a fractional LP
solution is a tie-break), and the mean dual gap value - LP (>= 0; <= eps * H_max at the
optimum). --threads sets torch's CPU threads (default 1: HiGHS runs single-threaded too).
"""

from __future__ import annotations

import argparse
import time

import torch
from benchutil import write_results

import structtorch as st
from structtorch import inference as inf

K_STATES, BATCH = 2, 64
LP_EXAMPLES = {6: 64, 14: 64, 50: 16, 200: 4}


def crank_potentials(n: int, B: int, coupling: float, device: torch.device, dtype: torch.dtype,
                     seed: int = 0) -> st.Potentials:
    """unary [B, n, 2] ~ N(0, 1); pairwise [B, E, 2, 2] with only the (1, 1) entry ~ N(0, (c/(n-1))^2)."""
    g = st.Graph.complete(n)
    gen = torch.Generator().manual_seed(seed)
    unary = torch.randn(B, n, K_STATES, generator=gen, dtype=torch.float64)
    pair = torch.zeros(B, g.num_edges, K_STATES, K_STATES, dtype=torch.float64)
    pair[..., 1, 1] = torch.randn(B, g.num_edges, generator=gen, dtype=torch.float64) * coupling / (n - 1)
    return st.Potentials(unary.to(device, dtype), pair.to(device, dtype), g)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_smoothed(pot: st.Potentials, eps: float, iters: int, repeats: int
                  ) -> tuple[float, inf.SmoothedLPResult]:
    """Median seconds of one batched smoothed_lp call, and its result."""
    inf.smoothed_lp(pot, eps=eps, iters=1)  # warm-up: colouring, allocator
    times, res = [], None
    for _ in range(repeats):
        _sync(pot.device)
        t0 = time.perf_counter()
        res = inf.smoothed_lp(pot, eps=eps, iters=iters)
        _sync(pot.device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], res


def time_lp(pot: st.Potentials, count: int) -> tuple[float, inf.LPResult]:
    """Seconds per example of lp_map on the first ``count`` examples (one HiGHS call each)."""
    sub = st.Potentials(pot.unary[:count], pot.pairwise[:count], pot.graph)
    inf.lp_map(st.Potentials(pot.unary[:1], pot.pairwise[:1], pot.graph))  # warm-up: constraint matrix
    t0 = time.perf_counter()
    res = inf.lp_map(sub)
    return (time.perf_counter() - t0) / count, res


def bench_size(n: int, args: argparse.Namespace, device: torch.device) -> dict:
    pot = crank_potentials(n, BATCH, args.coupling, device, torch.float32)
    eps = args.eps_scale / (n - 1)
    repeats = 1 if n >= 200 else args.repeats
    t_smooth, res = time_smoothed(pot, eps, args.iters, repeats)
    count = LP_EXAMPLES.get(n, 4)
    t_lp, lp = time_lp(pot, count)
    y_s, y_lp = res.assignment[:count].cpu(), lp.assignment.cpu()
    g = pot.graph
    h_max = n * torch.log(torch.tensor(2.0)).item() + g.num_edges * torch.log(torch.tensor(4.0)).item()
    return {
        "n": n, "edges": g.num_edges, "batch": BATCH, "lp_examples": count, "eps": eps,
        "iters": args.iters,
        "smoothed_ms_per_example": 1e3 * t_smooth / BATCH,
        "lp_ms_per_example": 1e3 * t_lp,
        "speedup_lp_over_smoothed": t_lp / (t_smooth / BATCH),
        "equal_assignment_fraction": (y_s == y_lp).all(-1).double().mean().item(),
        "node_agreement": (y_s == y_lp).double().mean().item(),
        "lp_fractional_node_fraction": ((lp.unary - 0.5).abs() < 0.49).any(-1).double().mean().item(),
        "mean_dual_gap": (res.value[:count].double().cpu() - lp.value.double().cpu()).mean().item(),
        "eps_h_max": eps * h_max,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--eps-scale", type=float, default=0.03)
    ap.add_argument("--coupling", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="n in {6, 14, 50} only")
    ap.add_argument("--out", default="scripts/results/bench_smoothed.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = [6, 14, 50] if args.quick else [6, 14, 50, 200]
    rows = []
    head = (f"{'n':>4} {'E':>6} {'eps':>8} {'smoothed ms/ex':>15} {'lp ms/ex':>10} {'lp/smooth':>9} "
            f"{'equal y':>8} {'node agr':>8} {'lp frac':>8} {'gap':>9} {'eps*Hmax':>9}")
    print(head)
    for n in sizes:
        r = bench_size(n, args, device)
        rows.append(r)
        print(f"{r['n']:>4} {r['edges']:>6} {r['eps']:>8.2e} {r['smoothed_ms_per_example']:>15.3f} "
              f"{r['lp_ms_per_example']:>10.2f} {r['speedup_lp_over_smoothed']:>9.1f} "
              f"{r['equal_assignment_fraction']:>8.2f} {r['node_agreement']:>8.3f} "
              f"{r['lp_fractional_node_fraction']:>8.3f} {r['mean_dual_gap']:>9.4f} {r['eps_h_max']:>9.2f}",
              flush=True)
    write_results(args.out, rows, device, iters=args.iters, eps_scale=args.eps_scale, coupling=args.coupling,
                  dtype="float32", K=K_STATES, batch=BATCH)


if __name__ == "__main__":
    main()
