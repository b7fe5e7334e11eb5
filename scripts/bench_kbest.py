"""K-best MAP on trees: scaling of structtorch's tree_kbest in n and k, and torch-struct side by side.

    python scripts/bench_kbest.py [--device cuda] [--quick] [--repeats 7] [--threads 1]
                                  [--fused | --exact | --memory] [--out scripts/results/bench_kbest.json]

(a) tree_kbest on random trees (random parent attachment, random relabelling), K = 2, B = 64:
    time vs n at k = 8 and time vs k at n = 64, with the log-log slopes fitted by
    numpy.polyfit over the larger sizes (the smallest are dominated by per-call overhead);
    slope ~1 or below = linear.
(b) chains, B = 64, K = 2: tree_kbest vs torch-struct's LinearChainCRF(log_potentials).kmax(k)
    (scores only) and .topk(k) (the k best as edge one-hots, by autograd through the k-max
    semiring; timed only for k <= --topk-max-k, it takes seconds per call at k = 32); the
    k-best scores are checked to agree (float64) before timing. Ratios are torch-struct /
    structtorch (> 1: structtorch is faster). ``steps``: the contraction steps of the schedule tree_kbest
    chose (rake+compress: O(log n); rake-only: n), printed beside the times.

``--fused``: (a) and (b) with ``inference.backend("fused")`` (the fused CPU kernel, ``csrc/kbest_cpu.cpp``; the
schedule columns then name the eager program's), and (d) the kernel against the eager program on RTA's ensembles
(10 random spanning trees of 14, 174 and 983 labels, k = 8 and 32), written to ``bench_kbest_fused.json``.

Times are the best (min) of --repeats calls (3 for calls over a second) after one warm-up call
(schedule cache, allocator), in milliseconds, float32. JSON: ``rows`` holds (b), ``scaling`` (a), ``ensembles`` (d).

``--exact`` instead: (e) RTA's search for the maximiser (``ensemble_search``, 10 random spanning trees, k = 8 doubled to
min(2 n, 32), the fused backend, as RTA's defaults) against the enumeration of every labelling (``exact=True``,
``ensemble_enumerate``) at 6, 14, 19 and 22 labels: milliseconds per row, the K-best search's certified share, how
often the two answers agree, and that the enumeration's score is never below the K-best answer's. Writes
``bench_kbest_exact.json``.

``--memory`` instead: (c) ``ensemble_map``'s peak memory at RTA's sizes (T = 40 trees, k = 32, B = 64, K = 2,
n up to 174 labels, the paper's largest), each call in a fresh process (peak RSS above the process's
footprint after building the inputs; CUDA: ``max_memory_allocated``): ``ensemble_map`` (candidates ranked on
the union graph, O(B T k n)), the K-best lists alone (``tree_kbest``, the floor), and the former candidate
scoring (every candidate on every tree, O(B T^2 k n)) where it fits. Writes ``bench_kbest_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
import warnings

import numpy as np
import torch
from benchutil import timeit, write_results

import structtorch as st
from structtorch import inference as inf
from structtorch.inference.kbest import cheapest_schedule, ensemble_search
from structtorch.structure import random_spanning_trees

try:
    from torch_struct import LinearChainCRF
except ImportError:  # pragma: no cover - optional benchmark dependency
    LinearChainCRF = None

K_STATES, BATCH = 2, 64


def random_tree(n: int, seed: int) -> st.Graph:
    """Random parent attachment (node i joins a uniform earlier node), then a random relabelling."""
    rng = np.random.default_rng(seed)
    parent = np.array([rng.integers(0, i) for i in range(1, n)], dtype=np.int64)
    label = rng.permutation(n)
    edges = np.stack([label[parent], label[np.arange(1, n)]], 1)
    return st.Graph(n, torch.as_tensor(edges))


def random_potentials(graph: st.Graph, B: int, K: int, device: torch.device, dtype: torch.dtype,
                      seed: int = 0) -> st.Potentials:
    gen = torch.Generator().manual_seed(seed)
    unary = torch.randn(B, graph.num_nodes, K, generator=gen, dtype=torch.float64)
    pairwise = torch.randn(B, graph.num_edges, K, K, generator=gen, dtype=torch.float64)
    return st.Potentials(unary.to(device, dtype), pairwise.to(device, dtype), graph)


def to_torch_struct(unary: torch.Tensor, pairwise: torch.Tensor) -> torch.Tensor:
    """Chain potentials -> torch-struct log_potentials [B, n-1, K(next), K(prev)]."""
    edge = pairwise.transpose(-1, -2) + unary[:, 1:, :, None]
    edge[:, 0] += unary[:, 0][:, None, :]
    return edge


def loglog_slope(xs: list[int], ts: list[float], min_x: int) -> float:
    """Slope of log time on log size over the sizes >= min_x."""
    pts = [(x, t) for x, t in zip(xs, ts) if x >= min_x]
    if len(pts) < 2:
        return float("nan")
    x, t = np.array(pts, dtype=np.float64).T
    return float(np.polyfit(np.log(x), np.log(t), 1)[0])


# ---------------------------------------------------------------------- (a) scaling
def scaling(device, dtype, repeats, ns, ks, n_fixed, k_fixed) -> dict:
    vs_n = []
    print(f"\n(a) tree_kbest on random trees, K={K_STATES}, B={BATCH}: time vs n (k={k_fixed})")
    print(f"{'n':>6} {'ms':>10} {'ms/node':>10}")
    for n in ns:
        pot = random_potentials(random_tree(n, seed=n), BATCH, K_STATES, device, dtype)
        ms = 1e3 * timeit(lambda pot=pot: inf.tree_kbest(pot, k_fixed), device, repeats)
        vs_n.append({"n": n, "k": k_fixed, "ms": ms})
        print(f"{n:>6} {ms:>10.3f} {ms / n:>10.4f}", flush=True)
    vs_k = []
    print(f"\n    time vs k (n={n_fixed})")
    print(f"{'k':>6} {'ms':>10} {'ms/k':>10}")
    pot = random_potentials(random_tree(n_fixed, seed=n_fixed), BATCH, K_STATES, device, dtype)
    for k in ks:
        ms = 1e3 * timeit(lambda k=k: inf.tree_kbest(pot, k), device, repeats)
        vs_k.append({"n": n_fixed, "k": k, "ms": ms})
        print(f"{k:>6} {ms:>10.3f} {ms / k:>10.4f}", flush=True)
    min_n, min_k = ns[min(2, len(ns) - 2)], ks[min(2, len(ks) - 2)]
    slopes = {"n": loglog_slope(ns, [r["ms"] for r in vs_n], min_n), "n_fit_from": min_n,
              "k": loglog_slope(ks, [r["ms"] for r in vs_k], min_k), "k_fit_from": min_k}
    slopes["n_last"] = loglog_slope(ns[-2:], [r["ms"] for r in vs_n[-2:]], ns[-2])
    slopes["k_last"] = loglog_slope(ks[-2:], [r["ms"] for r in vs_k[-2:]], ks[-2])
    print(f"\n    log-log slope of time: vs n (n >= {min_n}) {slopes['n']:.2f}, "
          f"vs k (k >= {min_k}) {slopes['k']:.2f}   (~1 or below: linear)")
    print(f"    last doubling only: n {ns[-2]}->{ns[-1]} {slopes['n_last']:.2f}, "
          f"k {ks[-2]}->{ks[-1]} {slopes['k_last']:.2f}")
    return {"vs_n": vs_n, "vs_k": vs_k, "slopes": slopes}


# ---------------------------------------------------------------------- (b) torch-struct
def check_agreement(n: int, k: int, device: torch.device) -> float:
    """k-best scores of both libraries on one chain batch, float64; returns the max abs difference."""
    pot = random_potentials(st.Graph.chain(n), BATCH, K_STATES, device, torch.float64, seed=1)
    ours, _ = inf.tree_kbest(pot, k)
    theirs = LinearChainCRF(to_torch_struct(pot.unary, pot.pairwise)).kmax(k).detach().T  # [k, B] -> [B, k]
    diff = float((ours - theirs).abs().max())
    if not torch.allclose(ours, theirs, rtol=1e-9, atol=1e-9):
        raise AssertionError(f"k-best scores disagree with torch-struct (n={n}, k={k}): max diff {diff}")
    return diff


def schedule_steps(graph: st.Graph, k: int, device: torch.device) -> tuple[int, str]:
    """Steps of the schedule tree_kbest runs on graph at B = BATCH, K = K_STATES, and its kind."""
    sched = cheapest_schedule(graph, BATCH, K_STATES, k, device)
    return len(sched.steps), "compress" if sched.num_compressed else "rake"


def versus_torch_struct(device, dtype, repeats, sizes, topk_max_k) -> list[dict]:
    print(f"\n(b) chains, K={K_STATES}, B={BATCH}: structtorch tree_kbest vs torch-struct LinearChainCRF "
          f"(ratio = torch-struct / structtorch)")
    print(f"{'n':>5} {'k':>4} | {'steps':>14} | {'tree_kbest':>10} | {'kmax':>10} {'ratio':>7} | {'topk':>10} "
          f"{'ratio':>7} | {'max|diff|':>9}")
    rows = []
    for n, k in sizes:
        diff = check_agreement(n, k, device)
        pot = random_potentials(st.Graph.chain(n), BATCH, K_STATES, device, dtype)
        edge = to_torch_struct(pot.unary, pot.pairwise)
        ours = 1e3 * timeit(lambda pot=pot, k=k: inf.tree_kbest(pot, k), device, repeats)
        kmax = 1e3 * timeit(lambda edge=edge, k=k: LinearChainCRF(edge).kmax(k), device, repeats)
        topk = 1e3 * timeit(lambda edge=edge, k=k: LinearChainCRF(edge).topk(k), device, repeats) \
            if k <= topk_max_k else None
        steps, kind = schedule_steps(pot.graph, k, device)
        row = {"n": n, "k": k, "steps": steps, "schedule": kind, "structtorch_ms": ours, "ts_kmax_ms": kmax,
               "ts_topk_ms": topk, "kmax_ratio": kmax / ours, "topk_ratio": None if topk is None else topk / ours,
               "max_abs_diff_f64": diff}
        rows.append(row)
        topk_cols = f"{'skipped':>10} {'':>7}" if topk is None else f"{topk:>10.3f} {topk / ours:>6.2f}x"
        print(f"{n:>5} {k:>4} | {steps:>5} {kind:>8} | {ours:>10.3f} | {kmax:>10.3f} {kmax / ours:>6.2f}x | "
              f"{topk_cols} | {diff:>9.1e}", flush=True)
    return rows


# ---------------------------------------------------------------------- (d) ensembles: fused vs eager
def random_ensemble(n: int, T: int, B: int, device: torch.device, dtype: torch.dtype, per_tree_unary: bool,
                    scales: tuple[float, float] = (1.0, 1.0)) -> tuple[st.Potentials, torch.Generator]:
    """T random spanning trees of n labels (seed n) with Gaussian potentials of standard deviations ``scales``
    (unary [B, T, n, K] per tree or [B, n, K] shared, pairwise [B, T, n-1, K, K]), and the generator they were
    drawn from (seed n), for further draws."""
    g = random_spanning_trees(n, T, torch.Generator().manual_seed(n))
    gen = torch.Generator().manual_seed(n)
    unary = scales[0] * torch.randn(B, *((T,) if per_tree_unary else ()), n, K_STATES, generator=gen)
    pairwise = scales[1] * torch.randn(B, T, n - 1, K_STATES, K_STATES, generator=gen)
    return st.Potentials(unary.to(device, dtype), pairwise.to(device, dtype), g), gen


ENSEMBLE_SIZES = [(n, k) for n in (14, 174, 983) for k in (8, 32)]  # T = 10 trees, as RTA's default


def fused_vs_eager(device, dtype, repeats, T: int = 10) -> list[dict]:
    """tree_kbest on T random spanning trees (RTA's ensembles), B = BATCH, the fused kernel against the eager
    program on the same potentials, scores checked equal first."""
    print(f"\n(d) tree_kbest on {T} random spanning trees, K={K_STATES}, B={BATCH}: fused kernel vs eager program "
          f"(ratio = eager / fused)")
    print(f"{'n':>5} {'k':>4} | {'fused ms':>10} | {'eager ms':>10} | {'ratio':>7}")
    rows = []
    for n, k in ENSEMBLE_SIZES:
        pot, _ = random_ensemble(n, T, BATCH, device, dtype, per_tree_unary=True)
        times = {}
        for name in ("fused", "eager"):
            with inf.backend(name):
                times[name] = (inf.tree_kbest(pot, k)[0], 1e3 * timeit(lambda: inf.tree_kbest(pot, k), device, repeats))
        torch.testing.assert_close(times["fused"][0], times["eager"][0])
        fused_ms, eager_ms = times["fused"][1], times["eager"][1]
        rows.append({"n": n, "T": T, "k": k, "fused_ms": fused_ms, "eager_ms": eager_ms, "ratio": eager_ms / fused_ms})
        print(f"{n:>5} {k:>4} | {fused_ms:>10.3f} | {eager_ms:>10.3f} | {eager_ms / fused_ms:>6.1f}x", flush=True)
    return rows


# ---------------------------------------------------------------------- (e) ensembles: enumeration vs K-best
EXACT_SIZES = [(6, 512), (14, 256), (19, 64), (22, 16)]  # (labels, rows); T = 10 trees


def exact_vs_kbest(device, dtype, repeats, T: int = 10) -> list[dict]:
    """``ensemble_search`` by K-best lists (k = 8 doubled to min(2 n, 32)) and by enumeration on the same potentials
    (unary N(0, 0.5^2), pairwise N(0, 0.3^2) entries, a random exclude as in Def. 6's training), per row."""
    print(f"\n(e) ensemble_search on {T} random spanning trees, K={K_STATES}: K-best lists (k = 8 doubled to "
          f"min(2n, 32)) vs every labelling scored (ratio = K-best / enumeration)")
    print(f"{'n':>4} {'rows':>5} | {'K-best ms/row':>13} | {'exact ms/row':>12} | {'ratio':>6} | "
          f"{'K-best certified':>16} | {'agree':>5}")
    rows = []
    for n, B in EXACT_SIZES:
        pot, gen = random_ensemble(n, T, B, device, dtype, per_tree_unary=False, scales=(0.5, 0.3))
        exclude = torch.randint(0, K_STATES, (B, n), generator=gen).to(device)
        k_max = min(2 * n, 32)
        with inf.backend("fused" if device.type == "cpu" else "eager"):
            kbest = ensemble_search(pot, 8, k_max, exclude)
            exact = ensemble_search(pot, 8, k_max, exclude, exact=True)
            assert bool((exact.score >= kbest.score - 1e-5 * kbest.score.abs().clamp_min(1)).all())
            kbest_ms = 1e3 * timeit(lambda: ensemble_search(pot, 8, k_max, exclude), device, repeats) / B
            exact_ms = 1e3 * timeit(lambda: ensemble_search(pot, 8, k_max, exclude, exact=True), device, repeats) / B
        certified = float(kbest.certified.float().mean())
        agree = float((kbest.y == exact.y).all(-1).float().mean())
        rows.append({"n": n, "T": T, "rows": B, "k": 8, "k_max": k_max, "kbest_ms_per_row": kbest_ms,
                     "exact_ms_per_row": exact_ms, "ratio": kbest_ms / exact_ms, "kbest_certified": certified,
                     "agree": agree})
        print(f"{n:>4} {B:>5} | {kbest_ms:>13.3f} | {exact_ms:>12.3f} | {kbest_ms / exact_ms:>5.1f}x | "
              f"{100 * certified:>15.0f}% | {100 * agree:>4.0f}%", flush=True)
    return rows


# ---------------------------------------------------------------------- (c) ensemble_map memory
MEMORY_SIZES = [(14, 40, 32), (50, 40, 32), (174, 40, 32)]  # (n, T, k); B = 64
#: the former O(B T^2 k n) scoring is only run where its index tensors stay below a few GB
PER_TREE_MAX_N = 50


def _ensemble_call(method: str, pot: st.Potentials, k: int):
    if method == "ensemble_map":
        return inf.ensemble_map(pot, k)
    if method == "tree_kbest":
        return inf.tree_kbest(pot, k)
    ys = inf.tree_kbest(pot, k)[1]  # "per_tree": score every candidate on every tree (before the union graph)
    B, T, _, n = ys.shape
    return pot.score(ys.reshape(B, T * k, n).transpose(0, 1)).mean(-1)


def memory_child(method: str, n: int, T: int, k: int, device: torch.device) -> dict:
    """One measurement (run in its own process): peak memory and time of one call."""
    trees = random_spanning_trees(n, T, torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    pot = st.Potentials(torch.zeros(BATCH, n, K_STATES).to(device),
                        torch.randn(BATCH, T, n - 1, K_STATES, K_STATES, generator=gen).to(device), trees)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device) / 2 ** 20
    t = time.perf_counter()
    with torch.no_grad():
        _ensemble_call(method, pot, k)
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(device) / 2 ** 20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"method": method, "n": n, "T": T, "k": k, "B": BATCH, "peak_mib": round(peak - before, 1),
            "seconds": round(time.perf_counter() - t, 3)}


def memory(device: torch.device) -> list[dict]:
    print(f"\n(c) ensemble_map peak memory, B={BATCH}, K={K_STATES} (MiB above the inputs, one call per process)")
    print(f"{'n':>5} {'T':>4} {'k':>4} | {'method':>13} | {'peak MiB':>9} {'s':>8}")
    rows = []
    for n, T, k in MEMORY_SIZES:
        for method in ("tree_kbest", "ensemble_map", "per_tree"):
            if method == "per_tree" and n > PER_TREE_MAX_N:
                continue
            cmd = [sys.executable, __file__, "--memory-child", method, str(n), str(T), str(k), "--device", str(device)]
            row = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
            rows.append(row)
            print(f"{n:>5} {T:>4} {k:>4} | {method:>13} | {row['peak_mib']:>9.1f} {row['seconds']:>8.3f}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="fewer, smaller sizes (smoke test)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default); 1 is the "
                    "steadiest on a loaded machine")
    ap.add_argument("--topk-max-k", type=int, default=8, help="time torch-struct's topk (autograd through the "
                    "k-max semiring: seconds per call at k=32) only up to this k")
    ap.add_argument("--out", default="scripts/results/bench_kbest.json")
    ap.add_argument("--fused", action="store_true", help="(a) and (b) with inference.backend('fused'): the fused "
                    "CPU kernel of tree_kbest; writes bench_kbest_fused.json")
    ap.add_argument("--memory", action="store_true", help="(c) only: ensemble_map's peak memory at RTA's sizes")
    ap.add_argument("--exact", action="store_true", help="(e) only: the enumeration of every labelling against the "
                    "K-best search at 6-22 labels; writes bench_kbest_exact.json")
    ap.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*arg_constraints")  # torch-struct's distributions
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.memory_child:
        method, n, T, k = args.memory_child
        print(json.dumps(memory_child(method, int(n), int(T), int(k), device)))
        return
    if args.memory:
        rows = memory(device)
        write_results(args.out.replace("bench_kbest.json", "bench_kbest_memory.json"), rows, device, B=BATCH,
                      K=K_STATES)
        return
    if args.exact:
        rows = exact_vs_kbest(device, dtype, args.repeats)
        write_results(args.out.replace("bench_kbest.json", "bench_kbest_exact.json"), rows, device, dtype=args.dtype,
                      repeats=args.repeats, K=K_STATES)
        return
    if args.quick:
        ns, ks, repeats = [16, 32, 64, 128], [1, 2, 4, 8, 16], min(args.repeats, 3)
        ts_sizes = [(n, k) for n in (16, 128) for k in (2, 8)]
    else:
        ns, ks, repeats = [16, 32, 64, 128, 256, 512], [1, 2, 4, 8, 16, 32, 64], args.repeats
        ts_sizes = [(n, k) for n in (16, 128, 512, 1024) for k in (2, 8)] + [(16, 32), (128, 32)]
    print(f"device={device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.processor()})"
          f" torch={torch.__version__} threads={torch.get_num_threads()} dtype={args.dtype} repeats={repeats}")
    t0 = time.perf_counter()
    with inf.backend("fused" if args.fused else "eager"):
        scaled = scaling(device, dtype, repeats, ns, ks, n_fixed=64, k_fixed=8)
        if LinearChainCRF is None:
            print("\n(b) skipped: torch-struct is not installed (pip install --no-deps torch-struct)")
            rows = []
        else:
            rows = versus_torch_struct(device, dtype, repeats, ts_sizes, args.topk_max_k)
    sections = {"scaling": scaled}
    if args.fused:
        sections["ensembles"] = fused_vs_eager(device, dtype, repeats)
    total = time.perf_counter() - t0
    out = args.out.replace(".json", "_fused.json") if args.fused else args.out
    write_results(out, rows, device, sections=sections, dtype=args.dtype, repeats=repeats,
                  K=K_STATES, B=BATCH, quick=args.quick, total_s=total, backend="fused" if args.fused else "eager")
    print(f"\ntotal {total:.1f} s")

if __name__ == "__main__":
    main()
