"""Maximum spanning trees on complete graphs: structtorch vs scipy (and the alternatives we rejected).

    python scripts/bench_spanning.py [--device cuda] [--quick] [--threads 1] [--out scripts/results/bench_spanning.json]

For n in {50, 200, 1000} (n = 1000: 499,500 edges), one weight vector and a batch of 10
(CCCP restarts), random float32 weights and integer weights with many ties, the table shows the
best-of-repeats (min) wall-clock milliseconds of

  st        structtorch.structure.max_spanning_tree (Boruvka + filter-Kruskal prefix), batched
  boruvka   the same Boruvka core on all E edges, without the prefix filter (ablation)
  sort+uf   torch.sort (stable, descending) + a Python union-find stopping after n - 1 edges
  scipy     scipy.sparse.csgraph.minimum_spanning_tree on -w, csr matrix prebuilt (its best
            case), called once per batch row
  scipy+io  the same, including tensor -> numpy -> csr conversion

and the ratio scipy / st (> 1: structtorch is faster). Results are cross-checked (same total
weight as scipy, same edge set as sort+uf) before timing. CPU runs default to one thread: scipy
is single-threaded, and one thread is stable on a shared machine.
"""

from __future__ import annotations

import argparse

import numpy as np
import scipy
import scipy.sparse as sp
import torch
from benchutil import timeit as _timeit
from benchutil import write_results
from scipy.sparse.csgraph import minimum_spanning_tree

import structtorch as st
from structtorch.structure import max_spanning_tree
from structtorch.structure.spanning import edge_keys, endpoints, spanning_forest


def timeit(fn, device: torch.device, repeats: int) -> float:
    return _timeit(fn, device, repeats, slow_after=0.25, slow_repeats=2)  # slow baselines: keep a run ~2 min


def plain_boruvka(w: torch.Tensor, g: st.Graph) -> torch.Tensor:
    """Boruvka on all edges at once (no prefix filter): the ablation."""
    G, E = w.reshape(-1, g.num_edges).shape
    ends = g.edges.to(w.device).reshape(1, E, 2)
    eid = torch.arange(G * E, device=w.device)
    s, d = endpoints(ends, eid, E, g.num_nodes)
    return spanning_forest(s, d, edge_keys(w.reshape(-1), eid, G * E), G * g.num_nodes).reshape(w.shape)


def sort_union_find(w: torch.Tensor, g: st.Graph) -> torch.Tensor:
    """Kruskal with a Python union-find over the stable descending sort, stopping at n - 1 edges."""
    n = g.num_nodes
    order = torch.sort(w, dim=-1, descending=True, stable=True).indices.cpu()
    edges = g.edges.tolist()
    out = torch.zeros(w.shape, dtype=torch.bool)
    for r, row in enumerate(order.reshape(-1, g.num_edges)):
        parent = list(range(n))
        taken = 0
        keep = out.view(-1, g.num_edges)[r]
        for e in row.tolist():
            a, b = edges[e]
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            while parent[b] != b:
                parent[b] = parent[parent[b]]
                b = parent[b]
            if a != b:
                parent[a] = b
                keep[e] = True
                taken += 1
                if taken == n - 1:  # complete graph: connected
                    break
    return out.to(w.device)


def scipy_csr(w_row: np.ndarray, e: np.ndarray, n: int) -> sp.csr_matrix:
    return sp.csr_matrix((-w_row.astype(np.float64), (e[:, 0], e[:, 1])), shape=(n, n))


def run(device: torch.device, ns: list[int], batches: list[int], repeats: int) -> list[dict]:
    rows = []
    for n in ns:
        g = st.Graph.complete(n)
        e = g.edges.numpy()
        for kind in ("random", "ties"):
            for B in batches:
                gen = torch.Generator().manual_seed(n + B)
                if kind == "random":
                    w = torch.rand(B, g.num_edges, generator=gen)
                else:  # integers 1..4 (> 0: scipy drops explicit zeros), ~E/4 ties per value
                    w = torch.randint(1, 5, (B, g.num_edges), generator=gen).float()
                wd = w.to(device)
                w_np = w.numpy()
                mats = [scipy_csr(r, e, n) for r in w_np]
                # cross-checks
                mask = max_spanning_tree(wd, g)
                ref_total = np.array([-minimum_spanning_tree(m).sum() for m in mats])
                got_total = (w * mask.cpu()).sum(-1).double().numpy()
                assert np.allclose(got_total, ref_total, rtol=1e-6), (got_total, ref_total)
                assert torch.equal(mask.cpu(), sort_union_find(w, g))
                assert torch.equal(mask, plain_boruvka(wd, g))
                row = {"n": n, "E": g.num_edges, "weights": kind, "batch": B}
                row["st_ms"] = 1e3 * timeit(lambda: max_spanning_tree(wd, g), device, repeats)  # noqa: B023
                row["boruvka_ms"] = 1e3 * timeit(lambda: plain_boruvka(wd, g), device, repeats)  # noqa: B023
                row["sort_uf_ms"] = 1e3 * timeit(lambda: sort_union_find(wd, g), device, repeats)  # noqa: B023
                row["scipy_ms"] = 1e3 * timeit(
                    lambda: [minimum_spanning_tree(m) for m in mats], torch.device("cpu"), repeats)  # noqa: B023
                row["scipy_io_ms"] = 1e3 * timeit(
                    lambda: [minimum_spanning_tree(scipy_csr(r, e, n))  # noqa: B023
                             for r in wd.cpu().numpy()], torch.device("cpu"), repeats)  # noqa: B023
                row["ratio_scipy_over_st"] = row["scipy_ms"] / row["st_ms"]
                rows.append(row)
                print(f"{n:>5} {g.num_edges:>7} {kind:>6} {B:>3} | {row['st_ms']:8.2f} {row['boruvka_ms']:8.2f}"
                      f" {row['sort_uf_ms']:8.2f} | {row['scipy_ms']:8.2f} {row['scipy_io_ms']:8.2f}"
                      f" | {row['ratio_scipy_over_st']:6.2f}x", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--quick", action="store_true", help="n in {50, 200} only (smoke test)")
    ap.add_argument("--out", default="scripts/results/bench_spanning.json")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ns = [50, 200] if args.quick else [50, 200, 1000]
    print(f"device={device} torch={torch.__version__} scipy={scipy.__version__} threads={torch.get_num_threads()}")
    print("    n       E weights   B | st (ms)  boruvka  sort+uf |    scipy scipy+io | scipy/st")
    rows = run(device, ns, [1, 10], args.repeats)
    write_results(args.out, rows, device, scipy=scipy.__version__, repeats=args.repeats)


if __name__ == "__main__":
    main()
