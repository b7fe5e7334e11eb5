"""The loss-aimed decoders (``inference.decode``) against brute-force enumeration on random small trees and forests."""

from __future__ import annotations

import pytest
import torch
from conftest import graphs, make_potentials, potentials
from hypothesis import given, settings
from hypothesis import strategies as st

from structtorch import Graph, Potentials
from structtorch.inference import brute_force_marginals, tree_f1, tree_logz, tree_marginals, tree_mpm
from structtorch.inference.decode import _probability_of_zeros
from structtorch.inference.exact import all_assignments
from structtorch.learners.base import TEST_INFERENCE


@st.composite
def finite_potentials(draw, states=(2, 3, 4)) -> Potentials:
    """Random potentials without -inf entries (every row has a distribution) on a random tree or forest."""
    graph = draw(graphs(max_nodes=7))
    return make_potentials(graph, draw(st.sampled_from(states)), draw(st.sampled_from([(), (3,), (2, 2)])),
                           seed=draw(st.integers(0, 2**31 - 1)))


def probabilities(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor]:
    """Every assignment Y [A, n] and its probability P(Y | row) [*B, A], by enumeration."""
    ys = all_assignments(pot.graph.num_nodes, pot.num_states)
    scores = pot.score(ys.reshape(-1, *(1,) * len(pot.batch_shape), ys.shape[-1]))  # [A, *B]
    return ys, scores.movedim(0, -1).softmax(-1)


def plug_in_f1(p: torch.Tensor, p_empty: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The decoder's objective of prediction s [A, n] for one row: 2 sum_{i in S} p_i / (|S| + E|y|), and the
    exact P(y = 0) for the empty set."""
    size = s.sum(-1).to(p.dtype)
    value = 2 * (s * p).sum(-1) / (size + p.sum())
    return torch.where(size == 0, p_empty, value)


@settings(max_examples=80, deadline=None)
@given(finite_potentials())
def test_mpm_is_each_labels_posterior_mode(pot):
    mu = brute_force_marginals(pot)[0]  # [*B, n, K]
    y = tree_mpm(pot)
    assert y.shape == (*pot.batch_shape, pot.graph.num_nodes)
    chosen = mu.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(chosen, mu.max(-1).values, rtol=0, atol=1e-9)  # a mode (ties: either)


@settings(max_examples=80, deadline=None)
@given(finite_potentials(states=(2,)))
def test_f1_decoding_maximises_its_objective_over_every_subset(pot):
    ys, prob = probabilities(pot)  # [A, n], [*B, A]
    mu = brute_force_marginals(pot)[0][..., 1].reshape(-1, pot.graph.num_nodes)  # [rows, n]
    prob = prob.reshape(len(mu), -1)
    y = tree_f1(pot).reshape(len(mu), -1)
    for row in range(len(mu)):
        objective = plug_in_f1(mu[row], prob[row, 0], ys)  # ys[0] is the empty set
        got = plug_in_f1(mu[row], prob[row, 0], y[row : row + 1])
        torch.testing.assert_close(got, objective.max().reshape(1), rtol=0, atol=1e-9)


@settings(max_examples=80, deadline=None)
@given(potentials())
def test_the_empty_sets_probability_from_the_marginals_is_exact(pot):
    """``tree_f1`` reads P(y = 0) off the marginals (tree factorisation): equal to exp(score(0) - log Z), also with
    impossible states and impossible rows (probability 0)."""
    mu, mu_pair = tree_marginals(pot)
    zeros = torch.zeros(mu.shape[:-1], dtype=torch.long)
    exact = (pot.score(zeros) - tree_logz(pot)).exp().nan_to_num(0.0)
    torch.testing.assert_close(_probability_of_zeros(pot, mu, mu_pair), exact, rtol=0, atol=1e-10)


def test_f1_decoding_predicts_the_empty_set_when_it_is_likely():
    graph = Graph.chain(4)
    pot = Potentials(torch.tensor([[0.0, -3.0]] * 4), torch.zeros(3, 2, 2), graph)  # P(y = 0) = 0.95^4 = 0.81
    assert tree_f1(pot).sum() == 0
    ones = Potentials(torch.tensor([[0.0, 3.0]] * 4), torch.zeros(3, 2, 2), graph)
    assert tree_f1(ones).tolist() == [1, 1, 1, 1]


def test_decoders_refuse_what_they_cannot_decode():
    three = make_potentials(Graph.chain(3), 3)
    with pytest.raises(ValueError, match="tree_f1 decodes binary labels.*K=3"):
        tree_f1(three)
    ensemble = make_potentials(Graph(3, torch.tensor([[[0, 1], [1, 2]], [[0, 2], [2, 1]]])), 2)
    for decode in (tree_f1, tree_mpm):
        with pytest.raises(ValueError, match="ensemble"):
            decode(ensemble)


def test_learners_take_the_decoders_by_name():
    assert {"tree_map", "tree_mpm", "tree_f1"} <= set(TEST_INFERENCE)
