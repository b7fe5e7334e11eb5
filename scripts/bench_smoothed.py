"""Smoothed LP message passing (batched) vs the exact LP (scipy HiGHS, one example at a time),
at matched decoding quality.

    python scripts/bench_smoothed.py [--device cuda] [--max-iters 1000] [--eps-scale 0.03]
                                     [--coupling 2.0] [--repeats 3] [--threads 1] [--quick]
                                     [--out scripts/results/bench_smoothed.json]
    python scripts/bench_smoothed.py --fused [--threads 1]   # -> scripts/results/bench_smoothed_fused.json

Complete graphs, n in {6, 14, 50, 200}, K = 2, CRANK-style random potentials: unary ~ N(0, 1),
pairwise[e, 1, 1] = w_e ~ N(0, (coupling / (n - 1))^2), other pairwise entries 0 (the
1/(n-1) scaling keeps each node's total coupling O(1), so the LP stays mostly tight).
eps = eps_scale / (n - 1). lp_map solves the first L examples of a batch of B = 64 one by one
(L = 64, 64, 16, 4 for n = 6, 14, 50, 200: HiGHS needs seconds per example at n = 200).

Matched quality: smoothed_lp (the whole batch, no tol) gets the fewest sweeps from the ladder
5, 10, 20, 50, 100, 200, 500, 1000 (up to --max-iters) at which its decoded assignment equals
lp_map's on every one of the L examples whose LP solution is integral (on a fractional LP
solution, lp_map's argmax is a tie-break; those examples are counted separately), i.e. both
sides then produce the same decoded labels; ``matched`` is false if the ladder runs out.
Timing: both sides are timed at that setting with the same number of repeats (best of
--repeats, 1 at n = 200) after a warm-up; per-example time = smoothed batch time / 64, and
lp_map's time for its L examples / L.

Reported: ms per example for both, the LP / smoothed time ratio (> 1: smoothed is faster),
the sweeps needed, the fraction of examples whose whole decoded assignment equals lp_map's
(all L, and the integral ones), the fraction of fractional LP nodes (|mu - 1/2| < 0.49), and
the mean dual gap value - LP (>= 0; <= eps * H_max at the optimum). --threads sets torch's CPU
threads (default 1: HiGHS runs single-threaded too).

--fused: the eager sweeps against the fused C++ kernel (``inference.backend("fused")``) on the same calls,
float64, B = 1024 problems of the same complete graphs, each stopped by ``tol`` = 1e-4 as in training:
"cold" (zero messages, eps = eps_scale / (n - 1)) and "warm" (started from the messages of a converged
solve of potentials 1% away, as between two L-BFGS steps of Full). Reported: ms per call of each, the
ratio (> 1: fused is faster), the sweeps, and the largest difference of the values.
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


LADDER = (5, 10, 20, 50, 100, 200, 500, 1000)


def best_time(fn, repeats: int, device: torch.device) -> tuple[float, object]:
    """Best seconds of ``repeats`` calls of fn after one warm-up call, and the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return min(times), out


def matched_iters(pot: st.Potentials, eps: float, y_lp: torch.Tensor, integral: torch.Tensor, max_iters: int
                  ) -> tuple[int, bool]:
    """Fewest ladder sweeps at which smoothed_lp decodes like lp_map on all integral-LP examples."""
    count = len(y_lp)
    ladder = [it for it in LADDER if it <= max_iters] or [max_iters]
    for it in ladder:
        y = inf.smoothed_lp(pot, eps=eps, iters=it).assignment[:count].cpu()
        if bool((y == y_lp).all(-1)[integral].all()):
            return it, True
    return ladder[-1], False


def bench_size(n: int, args: argparse.Namespace, device: torch.device) -> dict:
    pot = crank_potentials(n, BATCH, args.coupling, device, torch.float32)
    eps = args.eps_scale / (n - 1)
    repeats = 1 if n >= 200 else args.repeats
    count = LP_EXAMPLES.get(n, 4)
    sub = st.Potentials(pot.unary[:count], pot.pairwise[:count], pot.graph)
    t_lp, lp = best_time(lambda: inf.lp_map(sub), repeats, device)
    y_lp = lp.assignment.cpu()
    integral = ~((lp.unary.cpu() - 0.5).abs() < 0.49).any(-1).any(-1)  # [L]: the LP solution is integral
    iters, matched = matched_iters(pot, eps, y_lp, integral, args.max_iters)
    t_smooth, res = best_time(lambda: inf.smoothed_lp(pot, eps=eps, iters=iters), repeats, device)
    y_s = res.assignment[:count].cpu()
    same = (y_s == y_lp).all(-1)
    g = pot.graph
    h_max = n * torch.log(torch.tensor(2.0)).item() + g.num_edges * torch.log(torch.tensor(4.0)).item()
    return {
        "n": n, "edges": g.num_edges, "batch": BATCH, "lp_examples": count, "eps": eps,
        "iters": iters, "matched": matched, "repeats": repeats,
        "smoothed_ms_per_example": 1e3 * t_smooth / BATCH,
        "lp_ms_per_example": 1e3 * t_lp / count,
        "speedup_lp_over_smoothed": (t_lp / count) / (t_smooth / BATCH),
        "equal_assignment_fraction": same.double().mean().item(),
        "equal_assignment_integral": same[integral].double().mean().item() if integral.any() else float("nan"),
        "integral_lp_examples": int(integral.sum()),
        "node_agreement": (y_s == y_lp).double().mean().item(),
        "lp_fractional_node_fraction": ((lp.unary - 0.5).abs() < 0.49).any(-1).double().mean().item(),
        "mean_dual_gap": (res.value[:count].double().cpu() - lp.value.double().cpu()).mean().item(),
        "eps_h_max": eps * h_max,
    }


def bench_fused(n: int, repeats: int) -> list[dict]:
    """Eager vs fused smoothed_lp (tol = 1e-4, float64, B = 1024), cold and warm-started."""
    pot = crank_potentials(n, 1024, 2.0, torch.device("cpu"), torch.float64)
    eps = 0.03 / (n - 1)
    gen = torch.Generator().manual_seed(1)
    near = st.Potentials(pot.unary + 0.01 * torch.randn(pot.unary.shape, generator=gen, dtype=torch.float64),
                         pot.pairwise * 1.01, pot.graph)
    start = inf.smoothed_lp(near, eps=eps, iters=2000, tol=1e-9).messages
    rows = []
    for regime, msgs in (("cold", None), ("warm", start)):
        times, out = {}, {}
        for _ in range(repeats):  # alternating, best of repeats: background load only adds time
            for fused in (False, True):
                with inf.backend("fused" if fused else "eager"):
                    t0 = time.perf_counter()
                    out[fused] = inf.smoothed_lp(pot, eps=eps, iters=2000, messages=msgs, tol=1e-4)
                    times[fused] = min(times.get(fused, float("inf")), time.perf_counter() - t0)
        rows.append({"n": n, "regime": regime, "batch": 1024, "eps": eps, "sweeps": out[True].iterations,
                     "eager_ms": 1e3 * times[False], "fused_ms": 1e3 * times[True],
                     "speedup_fused_over_eager": times[False] / times[True],
                     "max_value_difference": (out[True].value - out[False].value).abs().max().item()})
    return rows


def main_fused(args: argparse.Namespace) -> None:
    inf.backends.check_backend("fused")  # build first: not timed
    rows = []
    print(f"{'n':>4} {'regime':>6} {'sweeps':>6} {'eager ms':>9} {'fused ms':>9} {'eager/fused':>11} {'max dv':>8}")
    for n in [6, 14, 50] if args.quick else [6, 14, 50, 200]:
        for r in bench_fused(n, args.repeats):
            rows.append(r)
            print(f"{n:>4} {r['regime']:>6} {r['sweeps']:>6} {r['eager_ms']:>9.1f} {r['fused_ms']:>9.1f} "
                  f"{r['speedup_fused_over_eager']:>11.2f} {r['max_value_difference']:>8.1e}", flush=True)
    out = args.out.replace("bench_smoothed.json", "bench_smoothed_fused.json")
    write_results(out, rows, torch.device("cpu"), dtype="float64", tol=1e-4, threads=args.threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-iters", type=int, default=1000)
    ap.add_argument("--eps-scale", type=float, default=0.03)
    ap.add_argument("--coupling", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="n in {6, 14, 50} only")
    ap.add_argument("--fused", action="store_true", help="eager vs fused C++ sweeps (CPU), not vs the exact LP")
    ap.add_argument("--out", default="scripts/results/bench_smoothed.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.fused:
        return main_fused(args)
    device = torch.device(args.device)
    sizes = [6, 14, 50] if args.quick else [6, 14, 50, 200]
    rows = []
    head = (f"{'n':>4} {'E':>6} {'eps':>8} {'sweeps':>6} {'smoothed ms/ex':>15} {'lp ms/ex':>10} {'lp/smooth':>9} "
            f"{'equal y':>8} {'eq integ':>8} {'lp frac':>8} {'gap':>9} {'eps*Hmax':>9}")
    print(head)
    for n in sizes:
        r = bench_size(n, args, device)
        rows.append(r)
        print(f"{r['n']:>4} {r['edges']:>6} {r['eps']:>8.2e} {r['iters']:>5}{'' if r['matched'] else '!'} "
              f"{r['smoothed_ms_per_example']:>15.3f} "
              f"{r['lp_ms_per_example']:>10.2f} {r['speedup_lp_over_smoothed']:>9.1f} "
              f"{r['equal_assignment_fraction']:>8.2f} {r['equal_assignment_integral']:>8.2f} "
              f"{r['lp_fractional_node_fraction']:>8.3f} {r['mean_dual_gap']:>9.4f} {r['eps_h_max']:>9.2f}",
              flush=True)
    write_results(args.out, rows, device, max_iters=args.max_iters, eps_scale=args.eps_scale, coupling=args.coupling,
                  dtype="float32", K=K_STATES, batch=BATCH)


if __name__ == "__main__":
    main()
