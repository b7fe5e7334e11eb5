"""structtorch.structure: max spanning forests (vs scipy and a plain Kruskal), circuit rank,
CRANK's penalty (eq. 12) and CCCP linearisation (Prop. 4.3), uniform Pruefer trees."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.stats import chisquare

import structtorch as st
from structtorch import structure as sts
from structtorch.structure import spanning as spanning_mod

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------- references
class UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        self.parent[ra] = rb
        return True


def kruskal_ref(w: list[float], edges: np.ndarray, n: int) -> list[bool]:
    """Plain Kruskal: decreasing weight, ties by lower edge index."""
    uf = UnionFind(n)
    keep = [False] * len(w)
    for e in sorted(range(len(w)), key=lambda e: (-w[e], e)):
        keep[e] = uf.union(int(edges[e, 0]), int(edges[e, 1]))
    return keep


def num_components_ref(n: int, edges: np.ndarray) -> int:
    uf = UnionFind(n)
    for a, b in edges:
        uf.union(int(a), int(b))
    return len({uf.find(v) for v in range(n)})


def scipy_max_forest_weight(w: np.ndarray, edges: np.ndarray, n: int) -> float:
    """Total weight of a max spanning forest; needs w > 0 (scipy drops explicit zeros)."""
    assert (w > 0).all()
    a = sp.csr_matrix((-w.astype(np.float64), (edges[:, 0], edges[:, 1])), shape=(n, n))
    return -float(minimum_spanning_tree(a).sum())


def random_graph(rng: np.random.Generator, n: int, density: float) -> st.Graph:
    full = st.Graph.complete(n).edges
    keep = torch.as_tensor(rng.random(len(full)) < density)
    edges = full[keep]
    perm = torch.as_tensor(rng.permutation(len(edges)))  # edge order and orientation arbitrary
    edges = edges[perm]
    flip = torch.as_tensor(rng.random(len(edges)) < 0.5)
    edges[flip] = edges[flip].flip(-1)
    return st.Graph(n, edges.reshape(-1, 2))


@hs.composite
def graphs_and_weights(draw, min_n: int = 1, max_n: int = 9, kind: str | None = None):
    n = draw(hs.integers(min_n, max_n))
    seed = draw(hs.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    densities = [0.2, 0.5, 0.8, 1.0] if min_n < 20 else [0.8, 1.0]
    g = random_graph(rng, n, draw(hs.sampled_from(densities)))
    batch = draw(hs.sampled_from([(), (1,), (3,), (2, 2)]))
    kind = kind or draw(hs.sampled_from(["int", "float", "special"]))
    shape = (*batch, g.num_edges)
    if kind == "int":  # many ties
        w = torch.as_tensor(rng.integers(0, 3, shape), dtype=torch.float32)
    elif kind == "float":
        w = torch.as_tensor(rng.standard_normal(shape))
    else:  # zeros of both signs, infinities
        vals = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 2.5])
        w = torch.as_tensor(vals[rng.integers(0, len(vals), shape)], dtype=torch.float32)
    return g, w


def rows(x: torch.Tensor) -> torch.Tensor:
    """[*B, E] -> [prod(B), E] (also for E = 0)."""
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def check_against_kruskal(w: torch.Tensor, g: st.Graph, mask: torch.Tensor) -> None:
    assert mask.shape == w.shape and mask.dtype == torch.bool
    edges = g.edges.numpy()
    flat_w = rows(w).cpu().tolist()
    flat_m = rows(mask).cpu().tolist()
    n_forest = g.num_nodes - num_components_ref(g.num_nodes, edges)
    for wr, mr in zip(flat_w, flat_m):
        assert mr == kruskal_ref(wr, edges, g.num_nodes)
        assert sum(mr) == n_forest
        assert st.Graph.from_mask(torch.tensor(mr, dtype=torch.bool), g).is_forest


# ---------------------------------------------------------------------- max_spanning_tree
@HYP
@given(graphs_and_weights())
def test_mst_equals_kruskal_reference(gw):
    g, w = gw
    check_against_kruskal(w, g, sts.max_spanning_tree(w, g))


@settings(max_examples=25, deadline=None)
@given(graphs_and_weights(min_n=25, max_n=34))
def test_mst_dense_equals_kruskal_reference(gw):
    """E > 8 n: the prefix + filter path."""
    g, w = gw
    check_against_kruskal(w, g, sts.max_spanning_tree(w, g))


@HYP
@given(graphs_and_weights(kind="int"))
def test_mst_weight_equals_scipy(gw):
    g, w = gw
    w = w + 1.0  # integer weights 1..3 with many ties, > 0 for scipy
    mask = sts.max_spanning_tree(w, g)
    for wr, mr in zip(rows(w), rows(mask)):
        if g.num_edges:
            ref = scipy_max_forest_weight(wr.numpy(), g.edges.numpy(), g.num_nodes)
            assert float(wr[mr].sum()) == pytest.approx(ref)


@pytest.mark.parametrize("n,density", [(20, 1.0), (40, 0.9), (60, 0.5), (80, 0.15), (260, 1.0)])
@pytest.mark.parametrize("kind", ["uniform", "ties", "sorted", "zeros", "constant", "clique"])
def test_mst_dense_filter_path(n, density, kind):
    """Dense graphs take the prefix + filter path; adversarial orders must stay exact."""
    rng = np.random.default_rng(n * 7 + len(kind))
    g = random_graph(rng, n, density)
    E = g.num_edges
    if kind == "uniform":
        w = torch.rand(3, E, generator=torch.Generator().manual_seed(n))
    elif kind == "ties":
        w = torch.as_tensor(rng.integers(1, 4, (3, E)), dtype=torch.float64)
    elif kind == "sorted":  # decreasing with the index: Kruskal order = index order
        w = -torch.arange(E, dtype=torch.float32).expand(3, E) + torch.arange(3.0)[:, None]
    elif kind == "zeros":  # CRANK-like: mostly exact zeros
        w = torch.as_tensor(rng.random((3, E)) * (rng.random((3, E)) < 0.05))
    elif kind == "clique":  # the heaviest ~4 n edges sit inside a clique: many edges survive the filter
        inside = (g.edges < n // 2 + 2).all(-1)
        w = torch.rand(3, E, generator=torch.Generator().manual_seed(n)) + 2.0 * inside
    else:
        w = torch.ones(3, E)
    mask = sts.max_spanning_tree(w, g)
    check_against_kruskal(w, g, mask)
    if kind in ("uniform", "ties", "constant", "clique"):
        for wr, mr in zip(w, mask):
            ref = scipy_max_forest_weight(wr.numpy(), g.edges.numpy(), n)
            assert float(wr[mr].sum()) == pytest.approx(ref)


def test_mst_single_row_chunks(monkeypatch):
    """Force the one-row-per-chunk filter branch (taken by graphs with > 2**20 edges)."""
    monkeypatch.setattr(spanning_mod, "_CHUNK_CPU", 1)
    g = st.Graph.complete(30)
    w = torch.rand(4, g.num_edges, generator=torch.Generator().manual_seed(1))
    check_against_kruskal(w, g, sts.max_spanning_tree(w, g))


def test_mst_float64_ties_within_float32_resolution():
    """float64 weights that collide in float32 must still be ordered exactly."""
    g = st.Graph.complete(25)
    base = torch.rand(g.num_edges, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    w = 1.0 + base * 1e-12  # all equal in float32
    assert torch.unique(w.float()).numel() < 3
    check_against_kruskal(w, g, sts.max_spanning_tree(w, g))


def test_mst_integer_and_half_dtypes():
    g = st.Graph.complete(12)
    gen = torch.Generator().manual_seed(5)
    w = torch.randint(-3, 3, (2, g.num_edges), generator=gen)
    check_against_kruskal(w.float(), g, sts.max_spanning_tree(w, g))
    h = torch.randn(2, g.num_edges, generator=gen).half()
    check_against_kruskal(h.float(), g, sts.max_spanning_tree(h, g))


def test_mst_ensemble_graph():
    trees = sts.random_spanning_trees(6, 3, generator=torch.Generator().manual_seed(0))
    w = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1))
    mask = sts.max_spanning_tree(w, trees)
    assert mask.shape == (2, 3, 5) and bool(mask.all())  # a tree's spanning tree is itself
    k = st.Graph.complete(20).edges
    ens = st.Graph(20, torch.stack([k, k.flip(0), k[torch.randperm(len(k))]]))  # dense: filter path
    w = torch.randn(4, 3, len(k), generator=torch.Generator().manual_seed(2)).round(decimals=1)
    mask = sts.max_spanning_tree(w, ens)
    for t in range(3):
        check_against_kruskal(w[:, t], st.Graph(20, ens.edges[t]), mask[:, t])


def test_mst_bool_weights_and_spanning_forest():
    g = st.Graph.complete(6)
    w = torch.rand(2, g.num_edges, generator=torch.Generator().manual_seed(4)) > 0.5
    check_against_kruskal(w.float(), g, sts.max_spanning_tree(w, g))
    key = torch.tensor([3, 1, 2])  # triangle: smallest keys win
    forest = sts.spanning_forest(torch.tensor([0, 1, 0]), torch.tensor([1, 2, 2]), key, 3)
    assert forest.tolist() == [False, True, True]


def test_mst_edge_cases():
    g1 = st.Graph(1, torch.zeros(0, 2, dtype=torch.long))
    assert sts.max_spanning_tree(torch.zeros(3, 0), g1).shape == (3, 0)
    g = st.Graph.complete(4)
    assert sts.max_spanning_tree(torch.zeros(0, 6), g).shape == (0, 6)
    w = torch.tensor([-np.inf] * 6)
    assert sts.max_spanning_tree(w, g).tolist() == [True, True, True, False, False, False]
    w = torch.randn(6, requires_grad=True)
    assert not sts.max_spanning_tree(w, g).requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_mst_device(device):
    g = st.Graph.complete(40)
    w = torch.rand(10, g.num_edges, generator=torch.Generator().manual_seed(0))
    w[:, ::3] = w[:, ::3].round(decimals=1)  # some ties
    out = sts.max_spanning_tree(w.to(device), g)
    assert out.device.type == device
    assert torch.equal(out.cpu(), sts.max_spanning_tree(w, g))


def test_mst_bad_input():
    g = st.Graph.complete(5)
    with pytest.raises(ValueError, match=r"weights must have shape \[\*B, 10\]"):
        sts.max_spanning_tree(torch.zeros(9), g)
    with pytest.raises(ValueError, match=r"weights must have shape"):
        sts.max_spanning_tree(torch.tensor(1.0), g)
    w = torch.zeros(10)
    w[3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        sts.max_spanning_tree(w, g)
    with pytest.raises(TypeError, match="Graph"):
        sts.max_spanning_tree(torch.zeros(10), g.edges)
    with pytest.raises(TypeError, match="torch.Tensor"):
        sts.max_spanning_tree([0.0] * 10, g)
    with pytest.raises(TypeError, match="real"):
        sts.max_spanning_tree(torch.zeros(10, dtype=torch.complex64), g)
    ens = st.Graph(5, torch.stack([g.edges, g.edges]))
    with pytest.raises(ValueError, match=r"\[\*B, 2, 10\]"):
        sts.max_spanning_tree(torch.zeros(3, 10), ens)


# ---------------------------------------------------------------------- circuit rank
@HYP
@given(graphs_and_weights(kind="int"))
def test_circuit_rank_reference(gw):
    g, w = gw
    mask = w > 0
    r = sts.circuit_rank(mask, g)
    assert r.shape == w.shape[:-1] and r.dtype == torch.long
    edges = g.edges.numpy()
    for mr, rr in zip(rows(mask), r.reshape(-1).tolist()):
        sub = edges[mr.numpy()]
        assert rr == len(sub) + num_components_ref(g.num_nodes, sub) - g.num_nodes


def test_circuit_rank_examples():
    g = st.Graph.complete(5)
    assert sts.circuit_rank(torch.ones(10, dtype=torch.bool), g).item() == 10 - 4
    assert sts.circuit_rank(torch.zeros(2, 10, dtype=torch.bool), g).tolist() == [0, 0]
    tree = sts.max_spanning_tree(torch.rand(3, 10), g)
    assert sts.circuit_rank(tree, g).tolist() == [0, 0, 0]
    with pytest.raises(TypeError, match="BoolTensor"):
        sts.circuit_rank(torch.ones(10), g)
    with pytest.raises(ValueError, match=r"mask must have shape \[\*B, 10\]"):
        sts.circuit_rank(torch.ones(4, dtype=torch.bool), g)


# ---------------------------------------------------------------------- penalty (eq. 12)
@HYP
@given(graphs_and_weights(kind="int"))
def test_penalty_value_zero_iff_forest_and_gradient(gw):
    g, w = gw
    pi = (w * torch.rand(w.shape, dtype=torch.float64).add(0.5)).to(torch.float64)  # >= 0, exact zeros
    pi.requires_grad_(True)
    f = sts.circuit_rank_penalty(pi, g)
    assert f.shape == w.shape[:-1]
    tree = sts.max_spanning_tree(pi.detach(), g)
    expected = (pi.detach() * ~tree).sum(-1)
    torch.testing.assert_close(f.detach(), expected)
    support_rank = sts.circuit_rank(pi.detach() > 0, g)
    assert torch.equal(f.detach() == 0, support_rank == 0)  # 0 iff {pi > 0} is a forest
    grad_out = torch.rand(f.shape, dtype=torch.float64)
    f.backward(grad_out)
    torch.testing.assert_close(pi.grad, grad_out.unsqueeze(-1) * (~tree).double())


def test_penalty_gradcheck_and_examples():
    g = st.Graph.complete(6)
    pi = torch.rand(2, g.num_edges, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pi.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda p: sts.circuit_rank_penalty(p, g), (pi,))
    # triangle with weights 3, 2, 1: the lightest edge closes the cycle
    tri = st.Graph(3, [[0, 1], [1, 2], [0, 2]])
    assert sts.circuit_rank_penalty(torch.tensor([3.0, 2.0, 1.0]), tri).item() == 1.0
    assert sts.circuit_rank_penalty(torch.tensor([3.0, 2.0, 0.0]), tri).item() == 0.0
    inf = torch.tensor([np.inf, 2.0, 0.0])
    assert sts.circuit_rank_penalty(inf, tri).item() == 0.0  # no inf * 0 = NaN
    with pytest.raises(TypeError, match="floating"):
        sts.circuit_rank_penalty(torch.tensor([3, 2, 1]), tri)
    with pytest.raises(ValueError, match=r"pi must have shape \[\*B, 3\]"):
        sts.circuit_rank_penalty(torch.ones(2), tri)


# ---------------------------------------------------------------------- CCCP (Prop. 4.3)
@HYP
@given(graphs_and_weights(kind="float"))
def test_cccp_linearization(gw):
    g, w = gw
    w = w.to(torch.float64)
    v = sts.cccp_linearization(w, g)
    assert v.shape == w.shape and v.dtype == w.dtype
    tree = torch.tensor([kruskal_ref(r, g.edges.numpy(), g.num_nodes)
                         for r in rows(w.abs()).tolist()], dtype=torch.bool).reshape(w.shape)
    torch.testing.assert_close(v, torch.where(tree, w.sign(), torch.zeros_like(w)))
    # the linearisation is tight at w: ||w||_1 - v^T w = f(|w|)
    torch.testing.assert_close(w.abs().sum(-1) - (v * w).sum(-1), sts.circuit_rank_penalty(w.abs(), g))


def test_cccp_example():
    tri = st.Graph(3, [[0, 1], [1, 2], [0, 2]])
    v = sts.cccp_linearization(torch.tensor([-3.0, 0.5, 2.0]), tri)
    assert v.tolist() == [-1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="w_pair must have shape"):
        sts.cccp_linearization(torch.ones(4), tri)
    with pytest.raises(TypeError, match="floating"):
        sts.cccp_linearization(torch.ones(3, dtype=torch.long), tri)


# ---------------------------------------------------------------------- Pruefer trees
def test_pruefer_uniform_chi_square():
    n, samples = 4, 32000
    ts = sts.random_spanning_trees(n, samples, generator=torch.Generator().manual_seed(1234))
    assert ts.edges.shape == (samples, n - 1, 2)
    counts = Counter(tuple(map(tuple, e)) for e in ts.edges.tolist())
    all_trees = [c for c in itertools.combinations(itertools.combinations(range(n), 2), n - 1)
                 if st.Graph(n, list(c)).is_tree]
    assert len(all_trees) == n ** (n - 2) == 16
    assert set(counts) == set(all_trees)
    p = chisquare([counts[t] for t in all_trees]).pvalue
    assert p > 1e-3


def test_pruefer_uniform_n5_labelled_degree():
    """n = 5: the 125 trees are equally likely; check via chi-square over all of them."""
    ts = sts.random_spanning_trees(5, 25000, generator=torch.Generator().manual_seed(7))
    counts = Counter(tuple(map(tuple, e)) for e in ts.edges.tolist())
    assert len(counts) == 125
    assert chisquare(list(counts.values())).pvalue > 1e-3


@pytest.mark.parametrize("n", [1, 2, 3, 7, 50])
def test_random_spanning_trees_valid(n):
    T = 9
    ts = sts.random_spanning_trees(n, T, generator=torch.Generator().manual_seed(n))
    assert isinstance(ts, st.Graph) and ts.edges.shape == (T, n - 1, 2)
    assert ts.is_tree
    for t in range(T):
        assert st.Graph(n, ts.edges[t]).is_tree
        assert bool((ts.edges[t, :, 0] < ts.edges[t, :, 1]).all())
    one = sts.uniform_spanning_tree(n, generator=torch.Generator().manual_seed(0))
    assert one.edges.shape == (n - 1, 2) and one.is_tree and not one.is_ensemble


def test_random_spanning_trees_seeded_and_default_generator():
    a = sts.random_spanning_trees(8, 4, generator=torch.Generator().manual_seed(3))
    b = sts.random_spanning_trees(8, 4, generator=torch.Generator().manual_seed(3))
    assert a == b
    assert sts.uniform_spanning_tree(8).is_tree


@pytest.mark.parametrize("device", DEVICES)
def test_random_spanning_trees_generator_device(device):
    ts = sts.random_spanning_trees(10, 5, generator=torch.Generator(device).manual_seed(0))
    assert ts.is_tree and ts.edges.device.type == "cpu"


def test_random_spanning_trees_bad_input():
    with pytest.raises(ValueError, match="n .* must be >= 1"):
        sts.uniform_spanning_tree(0)
    with pytest.raises(ValueError, match="n .* must be >= 1"):
        sts.random_spanning_trees(-3, 2)
    with pytest.raises(TypeError, match="n .* must be an int"):
        sts.uniform_spanning_tree(4.0)
    with pytest.raises(ValueError, match="T .* must be >= 1"):
        sts.random_spanning_trees(4, 0)
    with pytest.raises(TypeError, match="T .* must be an int"):
        sts.random_spanning_trees(4, True)


def test_pruefer_decode_of_a_batch_is_the_trees_of_its_rows():
    seqs = torch.randint(0, 7, (6, 5), generator=torch.Generator().manual_seed(0))
    trees = sts.pruefer_decode(seqs, 7)
    assert trees.edges.shape == (6, 6, 2) and trees.is_tree
    for seq, edges in zip(seqs, trees.edges):
        assert torch.equal(sts.pruefer_decode(seq, 7).edges, edges)
    with pytest.raises(ValueError, match="a Pruefer sequence for n=7 has n-2 entries"):
        sts.pruefer_decode(seqs[:, :4], 7)


# ---------------------------------------------------------------------- NaN and empty batches
def test_circuit_rank_regulariser_names_its_nan_argument():
    tri = st.Graph.complete(3)
    with pytest.raises(ValueError, match="pi contains NaN"):
        sts.circuit_rank_penalty(torch.tensor([1.0, math.nan, 0.0]), tri)
    with pytest.raises(ValueError, match="w_pair contains NaN"):
        sts.cccp_linearization(torch.tensor([1.0, math.nan, 0.0]), tri)


@pytest.mark.parametrize("batch", [(0,), (2, 0)])
def test_structure_ops_on_an_empty_batch(batch):
    g = st.Graph.complete(4)
    w = torch.zeros(*batch, 6, requires_grad=True)
    assert sts.max_spanning_tree(w, g).shape == (*batch, 6)
    assert sts.circuit_rank(torch.zeros(*batch, 6, dtype=torch.bool), g).shape == batch
    f = sts.circuit_rank_penalty(w, g)
    f.sum().backward()
    assert f.shape == batch and w.grad.shape == w.shape
    assert sts.cccp_linearization(w, g).shape == (*batch, 6)


def test_structure_ops_on_one_node():
    g = st.Graph.empty(1)
    assert sts.circuit_rank(torch.zeros(2, 0, dtype=torch.bool), g).tolist() == [0, 0]
    assert sts.circuit_rank_penalty(torch.zeros(2, 0), g).tolist() == [0.0, 0.0]
    assert sts.uniform_spanning_tree(1).edges.shape == (0, 2)
    with pytest.raises(ValueError, match=r"n \(number of nodes\) must be >= 1"):
        sts.uniform_spanning_tree(0)
