"""Potentials: shapes, broadcasting, score(y), and input validation."""

from __future__ import annotations

import pytest
import torch
from conftest import NEG_INF, ensemble_potentials, make_potentials, member, potentials
from hypothesis import given, settings
from hypothesis import strategies as st

from structtorch import Graph, Potentials


def loop_score(unary: torch.Tensor, pairwise: torch.Tensor, edges: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Reference score for one graph: unary [*B, n, K], pairwise [*B, E, K, K], y [*B', n]."""
    total = 0
    for i in range(y.shape[-1]):
        total = total + torch.gather(unary[..., i, :].expand(*y.shape[:-1], -1), -1, y[..., i:i + 1])[..., 0]
    for e, (a, b) in enumerate(edges.tolist()):
        K = pairwise.shape[-1]
        flat = pairwise[..., e, :, :].flatten(-2).expand(*y.shape[:-1], K * K)
        total = total + torch.gather(flat, -1, (y[..., a] * K + y[..., b])[..., None])[..., 0]
    return total


def random_labels(shape: tuple[int, ...], K: int, seed: int) -> torch.Tensor:
    return torch.randint(0, K, shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- score
@pytest.mark.parametrize("graph", [Graph.chain(4), Graph.complete(4), Graph.grid(2, 2), Graph.empty(4),
                                   Graph(4, [[3, 0], [1, 0], [2, 1]])], ids=["chain", "complete", "grid",
                                                                            "empty", "reversed"])
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_score_matches_loop(graph, batch):
    pot = make_potentials(graph, 3, batch, seed=1, inf_prob=0.1)
    y = random_labels((*batch, 4), 3, seed=2)
    s = pot.score(y)
    assert s.shape == batch
    torch.testing.assert_close(s, loop_score(pot.unary, pot.pairwise, graph.edges, y))


def test_score_uses_stored_edge_orientation():
    unary = torch.zeros(2, 2)
    pairwise = torch.tensor([[[0.0, 1.0], [10.0, 100.0]]])  # pairwise[0, a, b]: y[0] = a, y[1] = b
    for edges, y, want in [([[0, 1]], [0, 1], 1.0), ([[0, 1]], [1, 0], 10.0),
                           ([[1, 0]], [0, 1], 10.0), ([[1, 0]], [1, 0], 1.0), ([[0, 1]], [1, 1], 100.0)]:
        pot = Potentials(unary, pairwise, Graph(2, edges))
        assert pot.score(torch.tensor(y)).item() == want


@settings(max_examples=30, deadline=None)
@given(potentials(), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_score_broadcasts_sample_dims(pot, S, seed):
    """y [S, *B, n] scores to [S, *B], each sample like scoring it alone."""
    B, n, K = pot.batch_shape, pot.graph.num_nodes, pot.num_states
    y = random_labels((S, *B, n), K, seed)
    s = pot.score(y)
    assert s.shape == (S, *B)
    u, p = pot.expanded()
    torch.testing.assert_close(s, loop_score(u, p, pot.graph.edges, y))
    for i in range(S):
        torch.testing.assert_close(s[i], pot.score(y[i]))


@pytest.mark.parametrize("graph", [Graph(1, []), Graph.empty(3), Graph(3, torch.zeros(2, 0, 2, dtype=torch.long))],
                         ids=["single-node", "isolated-nodes", "edgeless-ensemble"])
def test_score_without_edges_keeps_pairwise_batch_dims(graph):
    """No edges: the score still has the full batch shape (and the T dim of an ensemble)."""
    E, lead = graph.num_edges, (graph.num_graphs,) if graph.is_ensemble else ()
    pot = Potentials(torch.randn(graph.num_nodes, 2), torch.zeros(5, *lead, E, 2, 2), graph)
    y = torch.ones(graph.num_nodes, dtype=torch.long)
    s = pot.score(y)
    assert s.shape == (5, *lead) and pot.batch_shape == (5,)
    torch.testing.assert_close(s, pot.unary[:, 1].sum().expand(5, *lead))


def test_score_of_impossible_assignment_is_neg_inf():
    unary = torch.zeros(3, 2)
    unary[1, 0] = NEG_INF
    pot = Potentials(unary, torch.zeros(2, 2, 2), Graph.chain(3))
    assert pot.score(torch.tensor([1, 0, 1])).item() == NEG_INF
    assert pot.score(torch.tensor([1, 1, 1])).item() == 0.0


def test_score_gradient_is_one_hot():
    g = Graph(3, [[2, 0], [0, 1]])
    unary = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    pairwise = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([2, 0, 1])
    Potentials(unary, pairwise, g).score(y).backward()
    assert torch.equal(unary.grad, torch.nn.functional.one_hot(y, 3).double())
    expected = torch.zeros(2, 3, 3, dtype=torch.float64)
    expected[0, 1, 2] = expected[1, 2, 0] = 1
    assert torch.equal(pairwise.grad, expected)


# ---------------------------------------------------------------------- shapes and broadcasting
@pytest.mark.parametrize("ushape,pshape,batch", [
    ((4, 2), (3, 2, 2), ()),
    ((5, 4, 2), (3, 2, 2), (5,)),
    ((4, 2), (5, 3, 2, 2), (5,)),
    ((2, 1, 4, 2), (3, 3, 2, 2), (2, 3)),
    ((1, 4, 2), (6, 3, 2, 2), (6,)),
])
def test_batch_shape_broadcasts(ushape, pshape, batch):
    pot = Potentials(torch.randn(ushape), torch.randn(pshape), Graph.chain(4))
    assert pot.batch_shape == batch
    u, p = pot.expanded()
    assert u.shape == (*batch, 4, 2) and p.shape == (*batch, 3, 2, 2)
    assert pot.num_states == 2 and pot.dtype == torch.float32 and pot.device == torch.device("cpu")


ENSEMBLE = Graph(3, torch.tensor([[[0, 1], [1, 2]], [[0, 2], [2, 1]]]))


@pytest.mark.parametrize("ushape,pshape,batch,per_graph", [
    ((3, 2), (2, 2, 2, 2), (), False),
    ((2, 3, 2), (2, 2, 2, 2), (), True),
    ((4, 3, 2), (4, 2, 2, 2, 2), (4,), False),
    ((4, 2, 3, 2), (2, 2, 2, 2), (4,), True),
    ((3, 2), (4, 2, 2, 2, 2), (4,), False),
    ((5, 3, 2), (4, 5, 2, 2, 2, 2), (4, 5), False),  # shared unary with fewer batch dims than pairwise
    ((4, 1, 2, 3, 2), (5, 2, 2, 2, 2), (4, 5), True),
])
def test_ensemble_unary_shared_or_per_graph(ushape, pshape, batch, per_graph):
    pot = Potentials(torch.randn(ushape), torch.randn(pshape), ENSEMBLE)
    assert pot.unary_per_graph == per_graph and pot.batch_shape == batch
    u, p = pot.expanded()
    assert u.shape == (*batch, 2, 3, 2) and p.shape == (*batch, 2, 2, 2, 2)
    y = random_labels((*batch, 3), 2, seed=0)
    s = pot.score(y)
    assert s.shape == (*batch, 2)
    for t in range(2):
        torch.testing.assert_close(s[..., t], member(pot, t).score(y))
        torch.testing.assert_close(s[..., t], loop_score(u[..., t, :, :], p[..., t, :, :, :], ENSEMBLE.edges[t], y))


@settings(max_examples=30, deadline=None)
@given(ensemble_potentials(), st.integers(0, 2**31 - 1))
def test_ensemble_score_is_per_member_score(pot, seed):
    y = random_labels((*pot.batch_shape, pot.graph.num_nodes), pot.num_states, seed)
    s = pot.score(y)
    assert s.shape == (*pot.batch_shape, pot.graph.num_graphs)
    for t in range(pot.graph.num_graphs):
        torch.testing.assert_close(s[..., t], member(pot, t).score(y))


def test_to_and_detach():
    pot = make_potentials(Graph.chain(3), 2, (2,))
    p32 = pot.to(torch.float32)
    assert p32.dtype == torch.float32 and p32.graph is pot.graph and p32.pairwise.dtype == torch.float32
    w = pot.unary.clone().requires_grad_()
    assert not Potentials(w, pot.pairwise, pot.graph).detach().unary.requires_grad


# ---------------------------------------------------------------------- validation
def chain_pot(**override) -> dict:
    args = dict(unary=torch.zeros(2, 3, 2), pairwise=torch.zeros(2, 2, 2, 2), graph=Graph.chain(3))
    args.update(override)
    return args


@pytest.mark.parametrize("unary", [torch.zeros(2, 4, 2), torch.zeros(2), torch.zeros(3)])
def test_unary_shape_mismatch(unary):
    with pytest.raises(ValueError, match=r"unary must have shape \[\*B, n=3, K\]"):
        Potentials(**chain_pot(unary=unary))


@pytest.mark.parametrize("pairwise", [torch.zeros(2, 3, 2, 2), torch.zeros(2, 2, 3, 3), torch.zeros(2, 2),
                                      torch.zeros(2, 2, 2, 3)])
def test_pairwise_shape_mismatch(pairwise):
    with pytest.raises(ValueError, match=r"pairwise must have shape \[\*B, E=2, K=2, K=2\]"):
        Potentials(**chain_pot(pairwise=pairwise))


def test_batch_dims_must_broadcast():
    with pytest.raises(ValueError, match=r"batch dims of unary \(2,\) and pairwise \(3,\) do not broadcast"):
        Potentials(**chain_pot(pairwise=torch.zeros(3, 2, 2, 2)))


def test_ensemble_pairwise_needs_tree_dim():
    with pytest.raises(ValueError, match=r"pairwise must have shape \[\*B, T=2, E=2, K=2, K=2\]"):
        Potentials(torch.zeros(3, 2), torch.zeros(3, 2, 2, 2), ENSEMBLE)


def test_ensemble_per_graph_unary_needs_matching_tree_dim():
    with pytest.raises(ValueError, match=r"per-graph unary \[\*B, T=2, n=3, K=2\]"):
        Potentials(torch.zeros(5, 3, 2), torch.zeros(2, 2, 2, 2), ENSEMBLE)


def test_ensemble_per_graph_unary_batch_must_broadcast():
    with pytest.raises(ValueError, match=r"batch dims of unary \(2,\) and pairwise \(3,\) do not broadcast"):
        Potentials(torch.zeros(2, 2, 3, 2), torch.zeros(3, 2, 2, 2, 2), ENSEMBLE)


@pytest.mark.parametrize("which", ["unary", "pairwise"])
def test_nan_potentials_rejected(which):
    t = chain_pot()[which].clone()
    t.view(-1)[1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        Potentials(**chain_pot(**{which: t}))


@pytest.mark.parametrize("which", ["unary", "pairwise"])
def test_pos_inf_potentials_rejected(which):
    t = chain_pot()[which].clone()
    t.view(-1)[-1] = float("inf")
    with pytest.raises(ValueError, match=r"\+inf"):
        Potentials(**chain_pot(**{which: t}))


@pytest.mark.parametrize("which", ["unary", "pairwise"])
def test_pos_inf_beside_neg_inf_rejected(which):
    """+inf and -inf together sum to NaN: the check that reads the sum must still name +inf."""
    t = chain_pot()[which].clone()
    t.view(-1)[0], t.view(-1)[-1] = NEG_INF, float("inf")
    with pytest.raises(ValueError, match=r"\+inf"):
        Potentials(**chain_pot(**{which: t}))


def test_finite_potentials_whose_sum_overflows_accepted():
    u = torch.full((2, 3, 2), 3e38)  # float32: every entry finite, their sum +inf
    Potentials(**chain_pot(unary=u))


def test_neg_inf_potentials_accepted():
    u = torch.full((2, 3, 2), NEG_INF)
    Potentials(**chain_pot(unary=u))


@pytest.mark.parametrize("which,dtype", [("unary", torch.long), ("pairwise", torch.int32),
                                         ("unary", torch.bool)])
def test_integer_potentials_rejected(which, dtype):
    t = chain_pot()[which].to(dtype)
    with pytest.raises(TypeError, match=f"{which} must be a floating-point tensor"):
        Potentials(**chain_pot(**{which: t}))


def test_dtype_mismatch_rejected():
    with pytest.raises(TypeError, match="unary and pairwise must share a dtype"):
        Potentials(**chain_pot(pairwise=torch.zeros(2, 2, 2, 2, dtype=torch.float64)))


def test_non_tensor_and_non_graph_rejected():
    with pytest.raises(TypeError, match="unary must be a torch.Tensor"):
        Potentials(**chain_pot(unary=[[0.0, 0.0]] * 3))
    with pytest.raises(TypeError, match="graph must be a structtorch.Graph"):
        Potentials(**chain_pot(graph=torch.tensor([[0, 1], [1, 2]])))


@pytest.mark.parametrize("y,low,high", [([0, 2, 1], 0, 2), ([0, -1, 1], -1, 1), ([[0, 0, 0], [5, 0, 0]], 0, 5)])
def test_labels_out_of_range(y, low, high):
    pot = Potentials(**chain_pot())
    with pytest.raises(ValueError, match=rf"labels out of range.*\[0, K=2\), got min {low}, max {high}"):
        pot.score(torch.tensor(y))


@pytest.mark.parametrize("y", [torch.zeros(2, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long),
                               torch.zeros((), dtype=torch.long)])
def test_wrong_label_shape(y):
    pot = Potentials(**chain_pot())
    with pytest.raises(ValueError, match=r"y must have shape \[\*B, n=3\]"):
        pot.score(y)


@pytest.mark.parametrize("y", [torch.zeros(3), torch.zeros(3, dtype=torch.bool), [0, 1, 0]])
def test_non_integer_labels_rejected(y):
    pot = Potentials(**chain_pot())
    with pytest.raises(TypeError, match="y must be an integer"):
        pot.score(y)


# ---------------------------------------------------------------------- odd batches and labels
@pytest.mark.parametrize("y_batch", [(3,), (2, 3), (0,)])
def test_labels_whose_batch_does_not_broadcast_are_rejected(y_batch):
    pot = make_potentials(Graph.chain(3), 2, (2,))
    with pytest.raises(ValueError, match=r"y must have shape \[\*B, n=3\] with leading dims broadcastable to the "
                                         r"batch \*B = \(2,\)"):
        pot.score(torch.zeros(*y_batch, 3, dtype=torch.long))


def test_labels_with_extra_leading_dims_still_broadcast():
    pot = make_potentials(Graph.chain(3), 2, (2,))
    assert pot.score(torch.zeros(5, 1, 3, dtype=torch.long)).shape == (5, 2)
    assert pot.score(torch.zeros(3, dtype=torch.long)).shape == (2,)


def test_complex_labels_rejected():
    pot = make_potentials(Graph.chain(3), 2, (2,))
    with pytest.raises(TypeError, match="y must be an integer.*complex"):
        pot.score(torch.zeros(2, 3, dtype=torch.complex64))


@pytest.mark.parametrize("ensemble", [False, True])
def test_empty_batch_scores_are_empty(ensemble):
    g = Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 3], [1, 3], [2, 3]]])) if ensemble else Graph.chain(4)
    pot = make_potentials(g, 3, (0,), dtype=torch.float32)
    s = pot.score(torch.zeros(0, 4, dtype=torch.long))
    assert s.shape == ((0, 2) if ensemble else (0,)) and s.dtype == torch.float32
    assert pot.batch_shape == (0,)


def test_single_state_potentials():
    pot = make_potentials(Graph.chain(3), 1, (2,))
    torch.testing.assert_close(pot.score(torch.zeros(2, 3, dtype=torch.long)),
                               pot.unary.sum((-1, -2)) + pot.pairwise.sum((-1, -2, -3)))
