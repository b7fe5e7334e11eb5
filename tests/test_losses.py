"""Structured losses against brute-force enumeration: structured hinge (Hamming margin rescaling),
its loss-augmented subgradient, CRF negative log-likelihood (value and gradcheck), hamming_augment,
and bad labels."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structtorch import Graph, Potentials
from structtorch.inference import brute_force_logz, brute_force_map, smoothed_lp
from structtorch.inference.exact import all_assignments
from structtorch.losses import check_loss_finite, crf_nll, hamming_augment, map_value, structured_hinge


# ---------------------------------------------------------------------- helpers
def random_forest(n: int, gen: torch.Generator, forest: bool) -> Graph:
    """A random tree on n nodes (random parent attachment, relabelled, random orientation);
    forest=True drops a random subset of its edges."""
    if n == 1:
        return Graph.empty(1)
    parents = [int(torch.randint(0, i, (), generator=gen)) for i in range(1, n)]
    label = torch.randperm(n, generator=gen).tolist()
    edges = []
    for child, parent in zip(range(1, n), parents):
        a, b = label[parent], label[child]
        edges.append((a, b) if torch.rand((), generator=gen) < 0.5 else (b, a))
    if forest:
        edges = [e for e in edges if torch.rand((), generator=gen) < 0.6]
    return Graph(n, torch.tensor(edges, dtype=torch.long).reshape(-1, 2))


def random_problem(seed: int, n: int, K: int, B: int, forest: bool = False, dtype=torch.float64
                   ) -> tuple[Potentials, torch.Tensor]:
    """Gaussian potentials unary [B, n, K], pairwise [B, E, K, K] on a random tree/forest, labels [B, n]."""
    gen = torch.Generator().manual_seed(seed)
    g = random_forest(n, gen, forest)
    unary = (1.5 * torch.randn(B, n, K, generator=gen, dtype=torch.float64)).to(dtype)
    pair = (1.5 * torch.randn(B, g.num_edges, K, K, generator=gen, dtype=torch.float64)).to(dtype)
    y = torch.randint(0, K, (B, n), generator=gen)
    return Potentials(unary, pair, g), y


def brute_force_hinge(pot: Potentials, y: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """max_y' [score(y') + scale * Hamming(y, y')] - score(y) by enumerating every y' [B]."""
    ys = all_assignments(pot.graph.num_nodes, pot.num_states)  # [A, n]
    scores = pot.score(ys.unsqueeze(1))  # [A, B]
    hamming = (ys.unsqueeze(1) != y.unsqueeze(0)).sum(-1).to(scores.dtype)  # [A, B]
    return (scores + scale * hamming).max(0).values - pot.score(y)


problems = st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 6), st.sampled_from([2, 3]), st.integers(1, 4),
                     st.booleans())


# ---------------------------------------------------------------------- structured hinge
@settings(max_examples=40, deadline=None)
@given(problems, st.sampled_from([1.0, 0.5, 2.0]))
def test_structured_hinge_equals_brute_force_and_is_nonnegative(problem, scale):
    seed, n, K, B, forest = problem
    pot, y = random_problem(seed, n, K, B, forest)
    loss = structured_hinge(pot, y, scale=scale)
    assert loss.shape == (B,)
    assert (loss >= -1e-9).all()
    torch.testing.assert_close(loss, brute_force_hinge(pot, y, scale), rtol=1e-9, atol=1e-9)


def test_structured_hinge_default_max_fn_is_exact_map_value():
    pot, y = random_problem(3, 5, 3, 4)
    aug = hamming_augment(pot, y)
    torch.testing.assert_close(map_value(aug), brute_force_map(aug)[0])
    torch.testing.assert_close(structured_hinge(pot, y, map_value), structured_hinge(pot, y))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("extra", [0.0, 0.3])
def test_structured_hinge_is_zero_when_truth_wins_by_hamming_margin(seed, extra):
    """score(y) - score(y') >= Hamming(y, y') for every y' (equality when extra = 0) => loss 0."""
    gen = torch.Generator().manual_seed(seed)
    n, K, B = 6, 3, 4
    g = random_forest(n, gen, forest=False)
    y = torch.randint(0, K, (B, n), generator=gen)
    oh = torch.nn.functional.one_hot(y, K).double()
    unary = (1.0 + extra) * oh + 5.0  # a constant shift does not change score differences
    # pairwise tables that are maximal (0) at the true pair and <= 0 elsewhere
    pair = -torch.rand(B, g.num_edges, K, K, generator=gen, dtype=torch.float64)
    truth = oh[:, g.edges[:, 0], :, None] * oh[:, g.edges[:, 1], None, :]
    pair = pair * (1 - truth)
    pot = Potentials(unary, pair, g)
    loss = structured_hinge(pot, y)
    torch.testing.assert_close(loss, torch.zeros(B, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(brute_force_hinge(pot, y), torch.zeros(B, dtype=torch.float64), rtol=0, atol=1e-12)
    # a larger margin scale than the truth's lead makes the loss positive again
    assert (structured_hinge(pot, y, scale=2.0 + extra) > 0.5).all()


@settings(max_examples=30, deadline=None)
@given(problems)
def test_structured_hinge_gradient_is_loss_augmented_argmax_minus_truth(problem):
    """d loss / d unary = one-hot(y*) - one-hot(y), y* the loss-augmented argmax; same for pairwise."""
    seed, n, K, B, forest = problem
    pot, y = random_problem(seed, n, K, B, forest)
    unary = pot.unary.clone().requires_grad_(True)
    pair = pot.pairwise.clone().requires_grad_(True)
    structured_hinge(Potentials(unary, pair, pot.graph), y).sum().backward()
    _, y_star = brute_force_map(hamming_augment(pot, y))  # Gaussian potentials: unique argmax a.s.
    oh = torch.nn.functional.one_hot
    torch.testing.assert_close(unary.grad, (oh(y_star, K) - oh(y, K)).double())
    e = pot.graph.edges

    def pair_one_hot(a):
        o = oh(a, K).double()
        return o[:, e[:, 0], :, None] * o[:, e[:, 1], None, :]

    torch.testing.assert_close(pair.grad, pair_one_hot(y_star) - pair_one_hot(y))


def test_structured_hinge_accepts_float32():
    pot, y = random_problem(7, 5, 2, 3, dtype=torch.float32)
    loss = structured_hinge(pot, y)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, brute_force_hinge(pot.to(torch.float64), y).float(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- CRF likelihood
@settings(max_examples=40, deadline=None)
@given(problems)
def test_crf_nll_equals_brute_force_minus_log_probability(problem):
    seed, n, K, B, forest = problem
    pot, y = random_problem(seed, n, K, B, forest)
    nll = crf_nll(pot, y)
    assert nll.shape == (B,)
    assert (nll >= -1e-9).all()  # -log p(y) with p(y) <= 1
    torch.testing.assert_close(nll, brute_force_logz(pot) - pot.score(y), rtol=1e-9, atol=1e-9)


def test_crf_nll_probabilities_sum_to_one():
    pot, _ = random_problem(11, 4, 3, 2)
    ys = all_assignments(4, 3)  # [A, n]
    nll = crf_nll(pot, ys.unsqueeze(1).expand(-1, 2, -1))  # [A, B]
    torch.testing.assert_close(torch.exp(-nll).sum(0), torch.ones(2, dtype=torch.float64))


@pytest.mark.parametrize("seed,n,K,forest", [(0, 4, 2, False), (1, 5, 3, False), (2, 5, 2, True), (3, 1, 3, False)])
def test_crf_nll_gradcheck(seed, n, K, forest):
    pot, y = random_problem(seed, n, K, 2, forest)
    unary = pot.unary.clone().requires_grad_(True)
    pair = pot.pairwise.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda u, p: crf_nll(Potentials(u, p, pot.graph), y), (unary, pair))


def test_crf_nll_gradient_is_marginals_minus_one_hot():
    pot, y = random_problem(5, 5, 3, 3)
    unary = pot.unary.clone().requires_grad_(True)
    crf_nll(Potentials(unary, pot.pairwise, pot.graph), y).sum().backward()
    ys = all_assignments(5, 3)
    p = torch.softmax(pot.score(ys.unsqueeze(1)), 0)  # [A, B]
    mu = torch.einsum("ab,ank->bnk", p, torch.nn.functional.one_hot(ys, 3).double())
    torch.testing.assert_close(unary.grad, mu - torch.nn.functional.one_hot(y, 3).double())


# ---------------------------------------------------------------------- hamming_augment
@pytest.mark.parametrize("scale", [1.0, 0.25, 3.0])
def test_hamming_augment_adds_scale_to_wrong_states_only(scale):
    pot, y = random_problem(4, 6, 3, 5)
    aug = hamming_augment(pot, y, scale)
    wrong = 1.0 - torch.nn.functional.one_hot(y, 3).double()
    assert torch.equal(aug.unary, pot.unary + scale * wrong)
    assert torch.equal(aug.pairwise, pot.pairwise)
    assert aug.graph is pot.graph
    ys = all_assignments(6, 3)[::37]
    hamming = (ys.unsqueeze(1) != y).sum(-1).double()
    torch.testing.assert_close(aug.score(ys.unsqueeze(1)) - pot.score(ys.unsqueeze(1)), scale * hamming)


def test_hamming_augment_default_scale_adds_exactly_one():
    pot, y = random_problem(8, 4, 2, 3)
    aug = hamming_augment(pot, y).unary
    truth = torch.nn.functional.one_hot(y, 2).bool()
    assert torch.equal(aug[truth], pot.unary[truth])  # the true state is untouched
    assert torch.equal(aug[~truth], pot.unary[~truth] + 1.0)  # every wrong state gets exactly + 1


# ---------------------------------------------------------------------- bad labels
@pytest.mark.parametrize("fn", [hamming_augment, structured_hinge, crf_nll])
@pytest.mark.parametrize("bad", ["too_big", "negative", "wrong_n"])
def test_bad_labels_raise_value_error(fn, bad):
    pot, y = random_problem(0, 4, 3, 2)
    if bad == "too_big":
        y = y.clone()
        y[0, 1] = 3
    elif bad == "negative":
        y = y.clone()
        y[1, 0] = -1
    else:
        y = y[:, :3]
    with pytest.raises(ValueError, match="y"):
        fn(pot, y)


@pytest.mark.parametrize("fn", [hamming_augment, structured_hinge, crf_nll])
def test_float_labels_raise_type_error(fn):
    pot, y = random_problem(0, 4, 3, 2)
    with pytest.raises(TypeError, match="y"):
        fn(pot, y.double())


# ---------------------------------------------------------------------- no silent inf / NaN
def impossible_problem(batch: tuple[int, ...] = (4,)) -> tuple[Potentials, torch.Tensor, tuple, tuple]:
    """Chain potentials [*batch] where the label of one example is impossible (one of its unary states is
    -inf) and another example has no feasible assignment at all (a node with every state -inf)."""
    gen = torch.Generator().manual_seed(0)
    g = Graph.chain(3)
    unary = torch.randn(*batch, 3, 2, generator=gen, dtype=torch.float64)
    pair = torch.randn(*batch, 2, 2, 2, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 2, (*batch, 3), generator=gen)
    flat = [i for i in torch.cartesian_prod(*[torch.arange(b) for b in batch]).reshape(-1, len(batch)).tolist()]
    label_bad, infeasible = tuple(flat[1]), tuple(flat[-1])
    unary[label_bad + (0, int(y[label_bad + (0,)]))] = float("-inf")
    unary[infeasible + (2,)] = float("-inf")
    return Potentials(unary, pair, g), y, label_bad, infeasible


@pytest.mark.parametrize("fn", [structured_hinge, crf_nll])
def test_losses_name_the_impossible_and_the_infeasible_example(fn):
    pot, y, _, _ = impossible_problem()
    with pytest.raises(ValueError, match=rf"{fn.__name__} is not finite for 2 of 4 examples: example 1: the label y "
                                         r"has score -inf \(impossible under the potentials\); example 3: no "
                                         r"feasible assignment"):
        fn(pot, y)
    ok = Potentials(pot.unary[[0, 2]], pot.pairwise[[0, 2]], pot.graph)
    assert torch.isfinite(fn(ok, y[[0, 2]])).all()


def test_loss_error_names_multi_dim_batch_positions():
    pot, y, label_bad, infeasible = impossible_problem((2, 3))
    assert (label_bad, infeasible) == ((0, 1), (1, 2))
    with pytest.raises(ValueError, match=r"example \(0, 1\): the label y has score -inf.*example \(1, 2\): no "
                                         r"feasible"):
        crf_nll(pot, y)


def test_check_loss_finite_passes_finite_losses_through_unchanged():
    pot, y = random_problem(0, 4, 3, 2)
    unary = pot.unary.clone().requires_grad_(True)
    pot = Potentials(unary, pot.pairwise, pot.graph)
    loss = structured_hinge(pot, y, max_fn=map_value)
    assert check_loss_finite(loss, pot, y) is loss
    loss.sum().backward()
    assert unary.grad is not None and torch.isfinite(unary.grad).all()


def test_check_loss_finite_names_dataset_indices_and_truncates():
    g = Graph.chain(2)
    unary = torch.zeros(8, 2, 2, dtype=torch.float64)
    unary[:, 0, 0] = float("-inf")  # label 0 of node 0 impossible everywhere
    pot = Potentials(unary, torch.zeros(8, 1, 2, 2, dtype=torch.float64), g)
    y = torch.zeros(8, 2, dtype=torch.long)
    loss = map_value(pot) - pot.score(y)
    with pytest.raises(ValueError, match=r"Full.loss is not finite for 8 of 8 examples: example 0 \(dataset index "
                                         r"100\): the label y has score -inf.*example 4 \(dataset index 104\).*; "
                                         r"and 3 more$"):
        check_loss_finite(loss, pot, y, "Full.loss", index=torch.arange(100, 108))


def test_check_loss_finite_on_the_smoothed_lp_hinge_of_a_loopy_graph():
    """The Full learner's loss: smoothed-LP value of the augmented potentials - score(y), complete graph."""
    g = Graph.complete(4)
    gen = torch.Generator().manual_seed(1)
    unary = torch.randn(3, 4, 2, generator=gen, dtype=torch.float64)
    pair = torch.randn(3, 6, 2, 2, generator=gen, dtype=torch.float64)
    y = torch.zeros(3, 4, dtype=torch.long)
    pair[0, 2, 0, 0] = float("-inf")  # example 0: y's pair on edge 2 is impossible
    pair[2, 5] = float("-inf")  # example 2: edge 5 allows nothing
    pot = Potentials(unary, pair, g)
    loss = smoothed_lp(hamming_augment(pot, y), 0.1, 20).value - pot.score(y)
    with pytest.raises(ValueError, match=r"2 of 3 examples: example 0: the label y has score -inf.*; example 2: no "
                                         r"feasible assignment"):
        check_loss_finite(loss, pot, y)


def test_hamming_augment_on_an_ensemble_with_per_graph_unary():
    """unary [B, T, n, K] with B == T: the augmentation must follow the batch dim, not the T dim."""
    g = Graph(3, torch.tensor([[[0, 1], [1, 2]], [[0, 2], [1, 2]]]))
    gen = torch.Generator().manual_seed(2)
    pot = Potentials(torch.randn(2, 2, 3, 2, generator=gen, dtype=torch.float64),
                     torch.randn(2, 2, 2, 2, 2, generator=gen, dtype=torch.float64), g)
    y = torch.tensor([[0, 0, 0], [1, 1, 1]])
    aug = hamming_augment(pot, y, 0.5)
    wrong = 1.0 - torch.nn.functional.one_hot(y, 2).double()  # [B, n, K]
    torch.testing.assert_close(aug.unary, pot.unary + 0.5 * wrong[:, None])


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "1", True, None])
def test_hamming_augment_rejects_bad_scale(scale):
    pot, y = random_problem(0, 3, 2, 2)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        hamming_augment(pot, y, scale)


@pytest.mark.parametrize("fn", [hamming_augment, structured_hinge, crf_nll])
def test_labels_with_a_mismatched_batch_raise_value_error(fn):
    pot, y = random_problem(0, 4, 3, 2)
    with pytest.raises(ValueError, match=r"broadcastable to the batch \*B = \(2,\)"):
        fn(pot, torch.zeros(3, 4, dtype=torch.long))


@pytest.mark.parametrize("fn", [structured_hinge, crf_nll])
def test_losses_on_an_empty_batch(fn):
    pot, y = random_problem(0, 4, 3, 2)
    empty = Potentials(pot.unary[:0], pot.pairwise[:0], pot.graph)
    loss = fn(empty, y[:0])
    assert loss.shape == (0,) and loss.dtype == torch.float64
