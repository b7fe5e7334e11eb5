"""Entropy-smoothed LP message passing (``smoothed_lp``) and the exact LP reference (``lp_map``).

Entropy bound used throughout: every node and edge entropy is counted once (Domke 2013, Thm. 1),
so at the optimum  LP <= smoothed value <= LP + eps * H_max,  H_max = n log K + E log K**2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from structtorch import Graph, Potentials
from structtorch.inference import (
    brute_force_kbest,
    brute_force_map,
    lp_map,
    smoothed_lp,
    tree_map,
)
from structtorch.inference.smoothed import greedy_colouring, star_schedule

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
F64 = torch.float64


# ---------------------------------------------------------------------- helpers
def h_max(g: Graph, K: int) -> float:
    """Upper bound on the smoothing entropy: n log K + E log K^2."""
    return g.num_nodes * math.log(K) + g.num_edges * math.log(K * K)


def random_tree(n: int, rng: np.random.Generator) -> Graph:
    perm = rng.permutation(n)
    edges = [(perm[rng.integers(i)], perm[i]) for i in range(1, n)]
    edges = [(a, b) if rng.random() < 0.5 else (b, a) for a, b in edges]
    return Graph(n, np.array(edges, dtype=np.int64).reshape(-1, 2))


def random_graph(n: int, density: float, rng: np.random.Generator) -> Graph:
    i, j = np.triu_indices(n, 1)
    keep = rng.random(len(i)) < density
    edges = np.stack([i[keep], j[keep]], 1)
    flip = rng.random(len(edges)) < 0.5
    edges[flip] = edges[flip][:, ::-1]
    return Graph(n, edges.reshape(-1, 2))


def random_pot(g: Graph, K: int, B: int, rng: np.random.Generator, scale: float = 1.0) -> Potentials:
    u = torch.as_tensor(rng.normal(size=(B, g.num_nodes, K)) * scale)
    p = torch.as_tensor(rng.normal(size=(B, g.num_edges, K, K)) * scale)
    return Potentials(u, p, g)


graphs = st.tuples(st.integers(2, 8), st.sampled_from([2, 3]), st.floats(0.3, 1.0),
                   st.integers(0, 2**31 - 1))


def loopy_case(args: tuple) -> tuple[Graph, int, np.random.Generator]:
    n, K, density, seed = args
    rng = np.random.default_rng(seed)
    if K == 3:
        n = min(n, 7)
    return random_graph(n, density, rng), K, rng


# ---------------------------------------------------------------------- trees
@settings(max_examples=15, **SETTINGS)
@given(st.integers(2, 8), st.sampled_from([2, 3]), st.integers(0, 2**31 - 1))
def test_tree_value_within_entropy_bound_and_decodes_map(n, K, seed):
    rng = np.random.default_rng(seed)
    g = random_tree(n, rng)
    pot = random_pot(g, K, 1, rng)
    top, _ = brute_force_kbest(pot, 2)
    gap = float(top[0, 0] - top[0, 1])
    assume(gap > 1e-3)
    eps = 0.01
    # a clear margin: scale so that the gap exceeds 4 eps H_max, which forces the smoothed
    # optimum's node marginals to put > 1/2 on the MAP state
    c = max(1.0, 4 * eps * h_max(g, K) / gap)
    pot = Potentials(pot.unary * c, pot.pairwise * c, g)
    best, y = tree_map(pot)
    res = smoothed_lp(pot, eps=eps, iters=5000, tol=1e-10)
    assert float(res.value[0]) >= float(best[0]) - 1e-9
    assert float(res.value[0]) <= float(best[0]) + eps * h_max(g, K) + 1e-6
    assert torch.equal(res.assignment, y)
    assert torch.equal(res.decode(), y)
    assert torch.allclose(res.assignment_score, best)


def test_lp_map_exact_on_trees():
    rng = np.random.default_rng(0)
    for n, K in [(1, 3), (2, 2), (6, 3), (9, 2)]:
        g = random_tree(n, rng) if n > 1 else Graph.empty(1)
        pot = random_pot(g, K, 3, rng)
        lp = lp_map(pot)
        best, y = brute_force_map(pot)
        assert torch.allclose(lp.value, best, atol=1e-7)
        assert torch.equal(lp.assignment, y)


# ---------------------------------------------------------------------- loopy graphs
@settings(max_examples=20, **SETTINGS)
@given(graphs, st.sampled_from([0, 1, 3]), st.floats(0.05, 2.0))
def test_value_upper_bounds_map_and_lp_for_any_messages(case, iters, eps):
    g, K, rng = loopy_case(case)
    pot = random_pot(g, K, 3, rng)
    msgs = torch.as_tensor(rng.normal(size=(3, g.num_edges, 2, K)) * 3)
    res = smoothed_lp(pot, eps=eps, iters=iters, messages=msgs)
    best, _ = brute_force_map(pot)
    lp = lp_map(pot)
    assert (res.value >= lp.value - 1e-7).all()
    assert (lp.value >= best - 1e-7).all()
    assert (res.assignment_score <= best + 1e-9).all()
    assert torch.allclose(res.assignment_score, pot.score(res.assignment))


@settings(max_examples=10, **SETTINGS)
@given(graphs)
def test_converges_to_lp_value_as_eps_shrinks(case):
    g, K, rng = loopy_case(case)
    pot = random_pot(g, K, 2, rng)
    lp = lp_map(pot).value
    coarse = smoothed_lp(pot, eps=0.1, iters=3000, tol=1e-9)
    fine = smoothed_lp(pot, eps=0.01, iters=3000, tol=1e-9, messages=coarse.messages)
    assert (fine.value >= lp - 1e-7).all()
    assert (fine.value <= lp + 0.01 * h_max(g, K) + 1e-4).all()
    # the smoothed optimum grows with eps (the entropy is >= 0)
    assert (fine.value <= coarse.value + 1e-6).all()


@settings(max_examples=15, **SETTINGS)
@given(graphs)
def test_lp_map_is_a_feasible_relaxation(case):
    g, K, rng = loopy_case(case)
    pot = random_pot(g, K, 2, rng)
    lp = lp_map(pot)
    best, _ = brute_force_map(pot)
    assert (lp.value >= best - 1e-7).all()
    mu, mp = lp.unary, lp.pairwise
    e = g.edges
    assert torch.allclose(mu.sum(-1), torch.ones_like(mu[..., 0]), atol=1e-7)
    assert torch.allclose(mp.sum(-1), mu[:, e[:, 0]], atol=1e-7)
    assert torch.allclose(mp.sum(-2), mu[:, e[:, 1]], atol=1e-7)
    score = (mu * pot.unary).sum((-1, -2)) + (mp * pot.pairwise).sum((-1, -2, -3))
    assert torch.allclose(score, lp.value, atol=1e-6)


# ---------------------------------------------------------------------- the dual descends
@pytest.mark.parametrize("eps", [0.05, 1.0])
def test_dual_never_increases(eps):
    rng = np.random.default_rng(1)
    g = random_graph(8, 0.7, rng)
    pot = random_pot(g, 3, 4, rng, scale=2.0)
    values, msgs = [], None
    for _ in range(40):
        res = smoothed_lp(pot, eps=eps, iters=1, messages=msgs)
        values.append(res.value)
        msgs = res.messages
    v = torch.stack(values)
    assert (v[1:] <= v[:-1] + 1e-9 * (1 + v[:-1].abs())).all()
    assert (v[-1] < v[0]).all()
    # k sweeps in one call = k warm-started single sweeps
    res = smoothed_lp(pot, eps=eps, iters=40)
    assert res.iterations == 40
    assert torch.allclose(res.value, v[-1], atol=1e-9)
    assert torch.allclose(res.messages, msgs, atol=1e-7)


def test_warm_start_from_converged_messages_stops_at_once():
    rng = np.random.default_rng(2)
    g = random_graph(7, 0.8, rng)
    pot = random_pot(g, 3, 3, rng)
    res = smoothed_lp(pot, eps=0.2, iters=5000, tol=1e-10)
    assert res.iterations < 5000
    again = smoothed_lp(pot, eps=0.2, iters=5000, tol=1e-8, messages=res.messages)
    assert again.iterations <= 1
    assert torch.allclose(again.value, res.value, atol=1e-8)


def test_converged_pseudomarginals_are_locally_consistent():
    rng = np.random.default_rng(3)
    g = random_graph(8, 0.6, rng)
    pot = random_pot(g, 3, 2, rng)
    res = smoothed_lp(pot, eps=0.3, iters=10000, tol=1e-13)
    mu, mp, e = res.unary, res.pairwise, g.edges
    assert torch.allclose(mu.sum(-1), torch.ones_like(mu[..., 0]))
    assert torch.allclose(mp.sum((-1, -2)), torch.ones_like(mp[..., 0, 0]))
    assert torch.allclose(mp.sum(-1), mu[:, e[:, 0]], atol=1e-5)
    assert torch.allclose(mp.sum(-2), mu[:, e[:, 1]], atol=1e-5)
    # primal value at the pseudo-marginals matches the dual (strong duality)
    ent = -(mu * mu.clamp_min(1e-300).log()).sum((-1, -2)) - (mp * mp.clamp_min(1e-300).log()).sum((-1, -2, -3))
    primal = (mu * pot.unary).sum((-1, -2)) + (mp * pot.pairwise).sum((-1, -2, -3)) + 0.3 * ent
    assert torch.allclose(primal, res.value, atol=1e-4)


# ---------------------------------------------------------------------- gradients
def _loopy_inputs(seed: int, B: int = 2, n: int = 4, K: int = 2):
    rng = np.random.default_rng(seed)
    g = Graph.complete(n)
    u = torch.as_tensor(rng.normal(size=(B, n, K)), dtype=F64).requires_grad_()
    p = torch.as_tensor(rng.normal(size=(B, g.num_edges, K, K)), dtype=F64).requires_grad_()
    return g, u, p, rng


def test_gradcheck_fixed_messages():
    g, u, p, rng = _loopy_inputs(4)
    msgs = torch.as_tensor(rng.normal(size=(2, g.num_edges, 2, 2)))
    fn = lambda u, p: smoothed_lp(Potentials(u, p, g), eps=0.5, iters=0, messages=msgs).value  # noqa: E731
    assert torch.autograd.gradcheck(fn, (u, p))


def test_gradcheck_reoptimised_messages():
    """Forward re-converges the messages at every perturbation: Danskin's gradient."""
    g, u, p, _ = _loopy_inputs(5)
    fn = lambda u, p: smoothed_lp(Potentials(u, p, g), eps=1.0, iters=100000, tol=1e-14).value  # noqa: E731
    assert torch.autograd.gradcheck(fn, (u, p), atol=1e-5)


def test_gradient_is_pseudomarginals_with_broadcast_batch():
    rng = np.random.default_rng(6)
    g = random_graph(6, 0.7, rng)
    u = torch.as_tensor(rng.normal(size=(2, 3, 6, 3))).requires_grad_()
    p = torch.as_tensor(rng.normal(size=(g.num_edges, 3, 3))).requires_grad_()  # shared over the batch
    res = smoothed_lp(Potentials(u, p, g), eps=0.3, iters=20)
    assert res.value.shape == (2, 3) and res.messages.shape == (2, 3, g.num_edges, 2, 3)
    assert res.unary.shape == (2, 3, 6, 3) and res.pairwise.shape == (2, 3, g.num_edges, 3, 3)
    res.value.sum().backward()
    assert torch.allclose(u.grad, res.unary)
    assert torch.allclose(p.grad, res.pairwise.sum((0, 1)))
    # per-example results equal the batched ones
    one = smoothed_lp(Potentials(u[1, 2].detach(), p.detach(), g), eps=0.3, iters=20)
    assert torch.allclose(one.value, res.value[1, 2])
    assert torch.allclose(one.messages, res.messages[1, 2])


def test_lp_map_gradient_is_the_solution():
    g, u, p, _ = _loopy_inputs(7, n=5)
    lp = lp_map(Potentials(u, p, g))
    lp.value.sum().backward()
    assert torch.allclose(u.grad, lp.unary) and torch.allclose(p.grad, lp.pairwise)


# ---------------------------------------------------------------------- -inf potentials
@settings(max_examples=15, **SETTINGS)
@given(graphs, st.floats(0.1, 0.6))
def test_neg_inf_potentials_give_no_nan(case, frac):
    g, K, rng = loopy_case(case)
    B = 3
    pot = random_pot(g, K, B, rng)
    y0 = torch.as_tensor(rng.integers(K, size=(B, g.num_nodes)))  # kept feasible
    u = pot.unary.masked_fill(torch.as_tensor(rng.random(pot.unary.shape) < frac), -math.inf)
    p = pot.pairwise.masked_fill(torch.as_tensor(rng.random(pot.pairwise.shape) < frac), -math.inf)
    b = torch.arange(B)[:, None]
    u[b, torch.arange(g.num_nodes), y0] = pot.unary[b, torch.arange(g.num_nodes), y0]
    e = g.edges
    p[b, torch.arange(g.num_edges), y0[:, e[:, 0]], y0[:, e[:, 1]]] = \
        pot.pairwise[b, torch.arange(g.num_edges), y0[:, e[:, 0]], y0[:, e[:, 1]]]
    u.requires_grad_()
    p.requires_grad_()
    pot = Potentials(u, p, g)
    values, msgs = [], None
    for _ in range(5):
        res = smoothed_lp(pot, eps=0.1, iters=3, messages=msgs)
        values.append(res.value.detach())
        msgs = res.messages
    v = torch.stack(values)
    assert torch.isfinite(v).all()
    assert (v[1:] <= v[:-1] + 1e-9 * (1 + v[:-1].abs())).all()
    res.value.sum().backward()
    for t in (res.unary, res.pairwise, res.messages, u.grad, p.grad):
        assert not torch.isnan(t).any()
    assert torch.isfinite(res.messages).all()
    assert (res.unary[torch.isinf(u)] == 0).all() and (res.pairwise[torch.isinf(p)] == 0).all()
    best, _ = brute_force_map(pot.detach())
    lp = lp_map(pot.detach()).value
    assert (res.value >= lp - 1e-7).all() and (lp >= best - 1e-7).all()
    conv = smoothed_lp(pot.detach(), eps=0.01, iters=3000, tol=1e-9, messages=msgs)
    assert (conv.value <= lp + 0.01 * h_max(g, K) + 1e-4).all()
    # rounding a fractional solution may hit a -inf pair: a -inf score, never NaN
    assert not torch.isnan(conv.assignment_score).any() and (conv.assignment_score <= best + 1e-9).all()


def test_infeasible_row_gives_minus_inf_and_zero_grad():
    g, u, p, _ = _loopy_inputs(8, B=2, n=4, K=3)
    with torch.no_grad():
        u[0, 2] = -math.inf  # node 2 has no possible state in example 0
        p[1, 0] = -math.inf  # edge 0 has no possible pair in example 1
    res = smoothed_lp(Potentials(u, p, g), eps=0.1, iters=10, tol=1e-9)
    assert torch.isinf(res.value).all() and (res.value < 0).all()
    res.value.sum().backward()
    for t in (res.unary, res.pairwise, res.messages, u.grad, p.grad):
        assert not torch.isnan(t).any()
    assert (u.grad == 0).all() and (p.grad == 0).all()
    lp = lp_map(Potentials(u.detach(), p.detach(), g))
    assert torch.isinf(lp.value).all() and not torch.isnan(lp.unary).any()


# ---------------------------------------------------------------------- special graphs, layouts
def test_no_edges_is_exact_log_sum_exp():
    g = Graph.empty(4)
    u = torch.randn(3, 4, 2, dtype=F64)
    res = smoothed_lp(Potentials(u, torch.zeros(3, 0, 2, 2, dtype=F64), g), eps=0.5, iters=2)
    assert torch.allclose(res.value, 0.5 * (u / 0.5).logsumexp(-1).sum(-1))
    assert res.messages.shape == (3, 0, 2, 2)


def test_unbatched_single_state_and_float32():
    g = Graph.grid(3, 3)
    res = smoothed_lp(Potentials(torch.randn(9, 1), torch.randn(g.num_edges, 1, 1), g), eps=0.1, iters=3)
    assert res.value.shape == () and res.assignment.shape == (9,) and (res.assignment == 0).all()
    pot = Potentials(torch.randn(5, 9, 2), torch.randn(5, g.num_edges, 2, 2), g)
    r32 = smoothed_lp(pot, eps=0.05, iters=50)
    r64 = smoothed_lp(pot.to(F64), eps=0.05, iters=50)
    assert r32.value.dtype == torch.float32
    assert torch.allclose(r32.value.double(), r64.value, rtol=1e-4, atol=1e-3)


def test_colouring_is_proper_and_cached():
    for g in (Graph.complete(7), Graph.grid(4, 5), random_graph(12, 0.4, np.random.default_rng(9))):
        colour = greedy_colouring(g)
        e = g.edges.numpy()
        assert (colour[e[:, 0]] != colour[e[:, 1]]).all()
        s = star_schedule(g)
        assert star_schedule(g) is s
        slots = torch.cat([torch.arange(c.start, c.stop) for c in s.colours]) if s.colours else torch.zeros(0)
        assert torch.equal(slots, torch.arange(2 * g.num_edges))
    assert len(star_schedule(Graph.grid(4, 5)).colours) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    rng = np.random.default_rng(10)
    g = random_graph(8, 0.6, rng)
    pot = random_pot(g, 3, 4, rng)
    pot.unary[0, 1, 0] = -math.inf
    cpu = smoothed_lp(pot, eps=0.1, iters=30)
    gpu = smoothed_lp(pot.to("cuda"), eps=0.1, iters=30)
    assert gpu.value.device.type == "cuda"
    assert torch.allclose(gpu.value.cpu(), cpu.value) and torch.allclose(gpu.messages.cpu(), cpu.messages)
    assert torch.equal(gpu.assignment.cpu(), cpu.assignment)
    lp = lp_map(pot.to("cuda"))
    assert lp.value.device.type == "cuda" and lp.assignment.device.type == "cuda"


def test_per_problem_eps_equals_one_call_per_eps():
    """A tensor eps [*B] (one temperature per problem, as for a regularisation grid) gives each
    problem exactly what a call with its own scalar eps gives, value, gradient and messages."""
    rng = np.random.default_rng(7)
    g = random_graph(5, 0.8, rng)
    u = torch.as_tensor(rng.normal(size=(3, 2, 5, 2))).requires_grad_()
    p = torch.as_tensor(rng.normal(size=(3, 2, g.num_edges, 2, 2))).requires_grad_()
    eps = torch.tensor([[0.05], [0.3], [1.0]], dtype=F64)  # [3, 1] broadcast over the second batch dim
    res = smoothed_lp(Potentials(u, p, g), eps=eps, iters=40)
    res.value.sum().backward()
    for m in range(3):
        one = smoothed_lp(Potentials(u[m].detach(), p[m].detach(), g), eps=float(eps[m]), iters=40)
        assert torch.allclose(one.value, res.value[m])
        assert torch.allclose(one.messages, res.messages[m])
        assert torch.allclose(one.unary, u.grad[m]) and torch.allclose(one.pairwise, p.grad[m])


def test_tol_stops_each_problem_on_its_own():
    """With tol, a batch gives each problem what its own call gives (it stops after its own first sweep below
    tol, not when the slowest problem of the batch does); the call returns after the slowest one's sweeps."""
    rng = np.random.default_rng(11)
    g = random_graph(6, 0.9, rng)
    u = torch.as_tensor(rng.normal(size=(3, 6, 2)))
    p = torch.as_tensor(rng.normal(size=(3, g.num_edges, 2, 2))) * torch.tensor([0.01, 3.0, 1.0], dtype=F64)[:, None,
                                                                                                        None, None]
    eps = torch.tensor([0.5, 0.01, 0.05], dtype=F64)  # easy, hard, in between
    res = smoothed_lp(Potentials(u, p, g), eps=eps, iters=500, tol=1e-6)
    alone = [smoothed_lp(Potentials(u[b], p[b], g), eps=float(eps[b]), iters=500, tol=1e-6) for b in range(3)]
    assert len({one.iterations for one in alone}) == 3 and res.iterations == max(one.iterations for one in alone)
    for b, one in enumerate(alone):
        assert torch.allclose(one.messages, res.messages[b], atol=1e-12)
        assert torch.allclose(one.value, res.value[b], atol=1e-12)


@settings(max_examples=20, **SETTINGS)
@given(graphs, st.sampled_from([0.0, 0.3]), st.booleans())
def test_tol_stops_at_the_first_sweep_whose_dual_decrease_is_below_tol(case, frac, fused):
    """One problem at a time, tol stops after exactly the first sweep whose value decrease (measured with
    one-sweep calls) is below tol * eps, -inf states (pruned) included; the same for the fused kernel, which
    sums the decrease from each star update's terms inside the sweep."""
    from structtorch.inference import backend

    with backend("fused" if fused else "eager"):
        _check_first_sweep_below_tol(case, frac)


def _check_first_sweep_below_tol(case, frac) -> None:
    g, K, rng = loopy_case(case)
    assume(g.num_edges > 0)
    pot = random_pot(g, K, 1, rng, scale=2.0)
    y0 = torch.as_tensor(rng.integers(K, size=(g.num_nodes,)))  # kept feasible
    u = pot.unary[0].masked_fill(torch.as_tensor(rng.random(pot.unary.shape[1:]) < frac), -math.inf)
    p = pot.pairwise[0].masked_fill(torch.as_tensor(rng.random(pot.pairwise.shape[1:]) < frac), -math.inf)
    u[torch.arange(g.num_nodes), y0] = pot.unary[0, torch.arange(g.num_nodes), y0]
    p[torch.arange(g.num_edges), y0[g.edges[:, 0]], y0[g.edges[:, 1]]] = \
        pot.pairwise[0, torch.arange(g.num_edges), y0[g.edges[:, 0]], y0[g.edges[:, 1]]]
    pot, eps, tol = Potentials(u, p, g), 0.1, 1e-5
    msgs, value, first = None, smoothed_lp(pot, eps=eps, iters=0).value, None
    for sweep in range(1, 400):
        res = smoothed_lp(pot, eps=eps, iters=1, messages=msgs)
        decrease, msgs, value = float(value - res.value) / eps, res.messages, res.value
        assume(abs(decrease - tol) > 1e-9)  # a decrease at tol itself is decided by rounding
        if decrease < tol:
            first = sweep
            break
    assume(first is not None)
    assert smoothed_lp(pot, eps=eps, iters=400, tol=tol).iterations == first


# ---------------------------------------------------------------------- bad input
def test_bad_inputs():
    g = Graph.complete(4)
    pot = Potentials(torch.randn(2, 4, 3), torch.randn(2, 6, 3, 3), g)
    for eps in (0, -1.0, math.nan, math.inf, None, True):
        with pytest.raises(ValueError, match="eps"):
            smoothed_lp(pot, eps=eps, iters=1)
    for eps in (torch.tensor([0.1, 0.0]), torch.tensor([0.1, math.nan]), torch.ones(3)):
        with pytest.raises(ValueError, match="eps"):
            smoothed_lp(pot, eps=eps, iters=1)
    for iters in (-1, 1.5, None, False):
        with pytest.raises(ValueError, match="iters"):
            smoothed_lp(pot, eps=0.1, iters=iters)
    with pytest.raises(ValueError, match="tol"):
        smoothed_lp(pot, eps=0.1, iters=1, tol=-1.0)
    for shape in ((2, 6, 3), (6, 2, 3), (2, 6, 2, 2), (1, 6, 2, 3)):
        with pytest.raises(ValueError, match="messages"):
            smoothed_lp(pot, eps=0.1, iters=1, messages=torch.zeros(shape))
    with pytest.raises(ValueError, match="messages"):
        smoothed_lp(pot, eps=0.1, iters=1, messages=torch.full((2, 6, 2, 3), math.nan))
    with pytest.raises(TypeError, match="messages"):
        smoothed_lp(pot, eps=0.1, iters=1, messages=np.zeros((2, 6, 2, 3)))
    with pytest.raises(TypeError):
        smoothed_lp((pot.unary, pot.pairwise), eps=0.1, iters=1)
    ens = Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 2], [0, 1], [0, 3]]]))
    ens_pot = Potentials(torch.randn(4, 2), torch.randn(2, 3, 2, 2), ens)
    with pytest.raises(ValueError, match="single graph"):
        smoothed_lp(ens_pot, eps=0.1, iters=1)
    with pytest.raises(ValueError, match="single graph"):
        lp_map(ens_pot)
    with pytest.raises(TypeError):
        lp_map(None)


def test_a_batch_larger_than_the_memory_available_is_a_clear_memory_error(monkeypatch):
    """CRANK on delicious (10 restarts x 11,628 rows on 7,588 candidate edges) would need ~250 GiB: the sweeps
    must not start (and be killed by the operating system part-way through training) but say what to lower."""
    from structtorch.inference import smoothed

    free = smoothed.available_memory(torch.device("cpu"))
    assert free is None or free > 0
    g = Graph.complete(4)
    pot = Potentials(torch.randn(5, 4, 2, dtype=torch.float64), torch.randn(5, 6, 2, 2, dtype=torch.float64), g)
    need = smoothed.LP_WORKING_COPIES * 5 * 6 * 2 * 2 * 8
    monkeypatch.setattr(smoothed, "available_memory", lambda device: need - 1)
    with pytest.raises(MemoryError, match=r"5 problems .* on 6 edges .*model\.candidates"):
        smoothed_lp(pot, eps=0.1, iters=3)
    monkeypatch.setattr(smoothed, "available_memory", lambda device: need)
    assert torch.isfinite(smoothed_lp(pot, eps=0.1, iters=3).value).all()


# ---------------------------------------------------------------------- empty batches
@pytest.mark.parametrize("batch", [(0,), (2, 0)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_empty_batch_gives_empty_results(batch, dtype):
    g = Graph.grid(2, 3)
    n, E, K = g.num_nodes, g.num_edges, 3
    unary = torch.zeros(*batch, n, K, dtype=dtype, requires_grad=True)
    pot = Potentials(unary, torch.zeros(*batch, E, K, K, dtype=dtype), g)
    res = smoothed_lp(pot, 0.1, 5, messages=torch.zeros(*batch, E, 2, K), tol=1e-6)
    assert (res.value.shape, res.value.dtype, res.assignment.shape) == (batch, dtype, (*batch, n))
    assert res.unary.shape == (*batch, n, K) and res.pairwise.shape == (*batch, E, K, K)
    assert res.messages.shape == (*batch, E, 2, K) and res.assignment_score.shape == batch
    lp = lp_map(pot)
    assert (lp.value.shape, lp.value.dtype, lp.assignment.shape, lp.assignment.dtype) == (batch, dtype, (*batch, n),
                                                                                          torch.long)
    assert lp.unary.shape == (*batch, n, K) and lp.pairwise.shape == (*batch, E, K, K)
    (res.value.sum() + lp.value.sum()).backward()
    assert unary.grad.shape == unary.shape


def test_lp_map_on_one_node_and_one_state():
    pot = Potentials(torch.tensor([[0.5, 2.0, -1.0]], dtype=torch.float64), torch.zeros(0, 3, 3).double(),
                     Graph.empty(1))
    assert lp_map(pot).value.item() == 2.0 and lp_map(pot).assignment.tolist() == [1]  # batch ()
    one = Potentials(torch.ones(2, 4, 1, dtype=torch.float64), torch.ones(2, 6, 1, 1, dtype=torch.float64),
                     Graph.complete(4))
    torch.testing.assert_close(lp_map(one).value, torch.full((2,), 10.0, dtype=torch.float64))
    torch.testing.assert_close(smoothed_lp(one, 0.1, 3).value, torch.full((2,), 10.0, dtype=torch.float64))


# ---------------------------------------------------------------------- the fused CPU kernel (backend "fused")
def _both(pot: Potentials, eps, iters: int, tol: float | None, per_problem: bool = False) -> list:
    """(value, messages, unary, pairwise, d value / d potentials) of the fused kernel on the batch, then of the
    eager sweeps on the batch (or, with ``per_problem``, one problem at a time: each stopped on its own)."""
    from structtorch.inference import backend

    outs = []
    for enabled in (True, False):
        with backend("fused" if enabled else "eager"):
            outs.append(_solve_rows(pot, eps, iters, tol, per_problem and not enabled))
    return outs


def _solve_rows(pot: Potentials, eps, iters: int, tol: float | None, one_at_a_time: bool) -> list:
    """_both's outputs for the backend in force: the whole batch at once, or one problem at a time."""
    rows = [slice(b, b + 1) for b in range(pot.unary.shape[0])] if one_at_a_time else [slice(None)]
    parts = []
    for r in rows:
        u, p = pot.unary[r].clone().requires_grad_(), pot.pairwise[r].clone().requires_grad_()
        e = eps[r] if isinstance(eps, torch.Tensor) else eps
        res = smoothed_lp(Potentials(u, p, pot.graph), e, iters, tol=tol)
        res.value.sum().backward()
        parts.append((res.value.detach(), res.messages, res.unary, res.pairwise, u.grad, p.grad,
                      torch.tensor(res.iterations)))
    return [torch.cat([q[i].reshape(-1) for q in parts]) if i < 6 else torch.stack([q[i] for q in parts])
            for i in range(7)]


@settings(max_examples=25, **SETTINGS)
@given(graphs, st.sampled_from([None, 1e-5]))
def test_fused_sweeps_equal_eager(fused_kernels, case, tol):
    """The fused kernel gives the eager sweeps' messages, value, pseudo-marginals and gradient, with a
    temperature per problem; with tol, each problem of the batch gets what its own eager call gives (it stops
    after its own sweep), and the call reports the slowest problem's sweeps."""
    g, K, rng = loopy_case(case)
    pot = random_pot(g, K, 19, rng, scale=2.0)
    eps = torch.as_tensor(rng.uniform(0.05, 1.0, size=19))
    fused, eager = _both(pot, eps, 60 if tol is None else 2000, tol, per_problem=tol is not None)
    for a, b in zip(fused[:6], eager[:6]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    assert int(fused[6].max()) == int(eager[6].max())


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_sweeps_over_chunks_threads_and_float32(fused_kernels, threads):
    """A batch of several chunks (600 problems of a dense 14-node graph), split over one or two threads, in
    float64 and float32."""
    rng = np.random.default_rng(5)
    g = Graph.complete(14)
    default = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dtype, tol in ((F64, 1e-9), (torch.float32, 2e-4)):
            pot = random_pot(g, 2, 600, rng)
            pot = Potentials(pot.unary.to(dtype), pot.pairwise.to(dtype), g)
            fused, eager = _both(pot, 0.1, 25, None)
            for a, b in zip(fused[:6], eager[:6]):
                torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    finally:
        torch.set_num_threads(default)


def test_fused_keeps_neg_inf_potentials_on_the_eager_sweeps(fused_kernels):
    """-inf potentials (arc-consistency pruning) are the eager sweeps' job: same results with fused on."""
    g, u, p, _ = _loopy_inputs(8, B=3, n=5, K=3)
    u = u.detach().clone()
    u[:, 0, 0] = -math.inf
    fused, eager = _both(Potentials(u, p.detach(), g), 0.2, 30, 1e-6)
    for a, b in zip(fused, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
