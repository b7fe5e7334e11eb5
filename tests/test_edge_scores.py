"""Edge scores for tree-CRF structure learning (Bradley & Guestrin 2010, Sec. 4) and the estimated
conditionals behind them: exact scores against closed-form entropies, structure recovery, the batched
regressions against scikit-learn, count tables, end-to-end scores on synthetic tree CRFs, bad input."""

from __future__ import annotations

import importlib
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.linear_model import LogisticRegression

from structtorch import Graph
from structtorch.data import tree_crf_synthetic
from structtorch.energies.local import pad_subsets
from structtorch.estimation import (
    EDGE_SCORES,
    LAMBDA_GRID,
    conditional_log_probs,
    edge_scores,
    scores_from_log_probs,
    select_inputs,
)
from structtorch.estimation.conditionals import (
    _newton_step,
    distinct_rows,
    fit_logistic,
    logistic_cv_log_probs,
    table_log_probs,
)
from structtorch.folds import fold_assignment
from structtorch.inference.exact import all_assignments
from structtorch.structure import label_mutual_information, max_spanning_tree

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

EXACT_METHODS = ("piecewise", "local_cmi", "dci", "global_cmi")


# ---------------------------------------------------------------------- exact joints P(Y, X)
# A joint is a numpy array with one axis per variable: Y_0..Y_{n-1}, then X_0..X_{n-1}.
def random_joint(n: int, K: int, Kx: int, seed: int) -> np.ndarray:
    """A random strictly positive joint over n labels (K states) and n inputs (Kx states)."""
    logits = 1.5 * np.random.default_rng(seed).standard_normal([K] * n + [Kx] * n)
    p = np.exp(logits - logits.max())
    return p / p.sum()


def model_joint(model) -> np.ndarray:
    """P(Y, X) of a tractable ``tree_crf_synthetic`` model, by brute force over its super-nodes (2 y + x)."""
    n = model.num_labels
    z = all_assignments(n, 4)
    log_p = model.joint_potentials().score(z)
    P = np.zeros([2] * (2 * n))
    P[tuple(torch.cat([z // 2, z % 2], 1).numpy().T)] = (log_p - log_p.logsumexp(0)).exp().numpy()
    return P


def joint_intractable(model) -> np.ndarray:
    """P(X) P(Y | X) of an intractable-mode ``tree_crf_synthetic`` model, by brute force."""
    n = model.num_labels
    a = all_assignments(n, 2)
    log_px = model.input_potentials().score(a)
    xs, ys = a.repeat_interleave(len(a), 0), a.repeat(len(a), 1)
    log_p = (log_px - log_px.logsumexp(0)).repeat_interleave(len(a)) + model.conditional_log_likelihood(xs, ys)
    P = np.zeros([2] * (2 * n))
    P[tuple(torch.cat([ys, xs], 1).numpy().T)] = log_p.exp().numpy()
    return P


def entropy(P: np.ndarray, axes: list[int]) -> float:
    """H of the marginal of P over ``axes``."""
    m = P.sum(tuple(a for a in range(P.ndim) if a not in axes)).ravel()
    m = m[m > 0]
    return float(-(m * np.log(m)).sum())


def cond_entropy(P: np.ndarray, target: list[int], given_axes: list[int]) -> float:
    """H(target | given) = H(target, given) - H(given)."""
    return entropy(P, target + given_axes) - entropy(P, given_axes)


def closed_form_score(P: np.ndarray, n: int, method: str, i: int, j: int) -> float:
    """The paper's scores as entropies of marginal tables."""
    xij = list(range(n, 2 * n)) if method == "global_cmi" else [n + i, n + j]
    h_pair = cond_entropy(P, [i, j], xij)
    if method == "piecewise":
        return -h_pair
    if method in ("local_cmi", "global_cmi"):
        return cond_entropy(P, [i], xij) + cond_entropy(P, [j], xij) - h_pair
    return -h_pair + cond_entropy(P, [i], [n + i]) + cond_entropy(P, [j], [n + j])  # dci


def cond_log_at(P: np.ndarray, configs: np.ndarray, target: list[int], given_axes: list[int]) -> np.ndarray:
    """log P(target = . | given = configs[k, given]) [M, prod target states] at every configuration."""
    table = np.einsum(P, list(range(P.ndim)), target + given_axes)
    log_c = np.log(table) - np.log(table.sum(tuple(range(len(target))), keepdims=True))
    at = log_c[(slice(None),) * len(target) + tuple(configs[:, given_axes].T)]
    return np.moveaxis(at, -1, 0).reshape(len(configs), -1)


def exact_scores(P: np.ndarray, n: int, method: str) -> torch.Tensor:
    """``scores_from_log_probs`` on every configuration of P weighted by its probability, with the exact
    conditionals P(Y_ij | X_ij) (X for global_cmi) and P(Y_i | X_i)."""
    configs = np.array(list(itertools.product(*map(range, P.shape))))
    K = P.shape[0]
    xs = list(range(n, 2 * n))
    pairs = Graph.complete(n).edges.tolist()
    log_pair = np.stack([cond_log_at(P, configs, [i, j], xs if method == "global_cmi" else [n + i, n + j])
                         for i, j in pairs]).reshape(len(pairs), len(configs), K, K)
    log_node = np.stack([cond_log_at(P, configs, [i], [n + i]) for i in range(n)])
    return scores_from_log_probs(method, torch.from_numpy(log_pair), torch.from_numpy(configs[:, :n]),
                                 torch.from_numpy(log_node), weight=torch.from_numpy(P[tuple(configs.T)]))


def recovered(scores: torch.Tensor, n: int) -> torch.Tensor:
    return max_spanning_tree(scores, Graph.complete(n))


def chain_sda_margin(scores: torch.Tensor, n: int) -> float:
    """min over chain edges (i, i+1) on the chain path between k < l, l - k > 1, of S(i, i+1) - S(k, l):
    the Score Decay Assumption holds iff it is > 0."""
    index = {tuple(e): k for k, e in enumerate(Graph.complete(n).edges.tolist())}
    return min(float(scores[index[(i, i + 1)]] - scores[index[(k, l)]])
               for k, l in index if l - k > 1 for i in range(k, l))


# ---------------------------------------------------------------------- exact scores
def check_exact(P: np.ndarray, n: int) -> None:
    for method in EXACT_METHODS:
        want = torch.tensor([closed_form_score(P, n, method, i, j) for i, j in Graph.complete(n).edges.tolist()],
                            dtype=torch.float64)
        torch.testing.assert_close(exact_scores(P, n, method), want, rtol=0, atol=1e-10, msg=method)


SMALL_JOINTS = [(n, K, Kx) for n in (2, 3, 4) for K in (2, 3) for Kx in (2, 3) if (K * Kx) ** n <= 1000]


@settings(max_examples=12, deadline=None)
@given(shape=st.sampled_from(SMALL_JOINTS), seed=st.integers(0, 2**31 - 1))
def test_exact_scores_equal_closed_form_entropies(shape: tuple[int, int, int], seed: int) -> None:
    """Random positive joints, n labels with K states, n inputs with Kx states."""
    n, K, Kx = shape
    check_exact(random_joint(n, K, Kx, seed), n)


@pytest.mark.parametrize("structure", ["tree", "chain"])
def test_exact_scores_on_synthetic_joint(structure: str) -> None:
    model = tree_crf_synthetic(1, 1, num_labels=4, structure=structure, joint="tractable", seed=3)
    check_exact(model_joint(model), 4)


def test_cmi_reduces_to_mutual_information_when_x_is_independent() -> None:
    """With X uniform and independent of Y, local and global CMI equal I(Y_i; Y_j) (the Chow-Liu score)."""
    P = random_joint(3, 2, 2, seed=5)
    P = P.sum(tuple(range(3, 6)), keepdims=True) * np.full((1,) * 3 + (2,) * 3, 1 / 8)
    mi = [entropy(P, [i]) + entropy(P, [j]) - entropy(P, [i, j]) for i, j in Graph.complete(3).edges.tolist()]
    torch.testing.assert_close(exact_scores(P, 3, "local_cmi"), torch.tensor(mi, dtype=torch.float64),
                               rtol=0, atol=1e-10)
    torch.testing.assert_close(exact_scores(P, 3, "global_cmi"), torch.tensor(mi, dtype=torch.float64),
                               rtol=0, atol=1e-10)


# ---------------------------------------------------------------------- Score Decay Assumption
def test_sda_chain_recovered_by_dci_and_local_cmi() -> None:
    """Strong Y-Y, moderate Y-X factors on a 5-chain: the SDA holds for the exact scores, and the max
    spanning tree of DCI and of local CMI is the chain."""
    model = tree_crf_synthetic(1, 1, num_labels=5, structure="chain", strengths=(3.0, 1.0, 0.5), cross=False,
                               joint="tractable")
    P = model_joint(model)
    for method in ("dci", "local_cmi"):
        scores = exact_scores(P, 5, method)
        assert chain_sda_margin(scores, 5) > 0.05, method
        assert torch.equal(recovered(scores, 5), model.tree_edge_mask()), method


@pytest.mark.parametrize("strengths,alternating,cross", [
    ((3.0, 1.0, 1.0), False, False), ((3.0, 1.0, 1.0), False, True), ((3.0, 1.0, 0.5), True, True),
    ((2.0, 1.0, 1.0), True, True), ((4.0, 2.0, 1.0), True, False), ((4.0, 2.0, 1.0), True, True)])
def test_sda_holds_iff_chain_recovered(strengths: tuple[float, ...], alternating: bool, cross: bool) -> None:
    """Theorem 1 on exact scores: the max spanning tree is the chain iff the SDA holds (the settings mix
    both outcomes for both scores)."""
    model = tree_crf_synthetic(1, 1, num_labels=5, structure="chain", strengths=strengths,
                               alternating=alternating, cross=cross, joint="tractable")
    P = model_joint(model)
    for method in ("dci", "local_cmi"):
        scores = exact_scores(P, 5, method)
        margin = chain_sda_margin(scores, 5)
        assert abs(margin) > 1e-3  # no near-ties: the outcome is well defined
        assert torch.equal(recovered(scores, 5), model.tree_edge_mask()) == (margin > 0), method


# ---------------------------------------------------------------------- batched regressions vs sklearn
def design_of(x: torch.Tensor, subsets: torch.Tensor) -> torch.Tensor:
    """[R, N, P] inputs of padded subsets, padding columns zero."""
    return torch.cat([x, x.new_zeros(len(x), 1)], 1)[:, subsets].permute(1, 0, 2)


def sklearn_probs(x: np.ndarray, t: np.ndarray, num_classes: int, lam: float, weight: np.ndarray | None = None,
                  tol: float = 1e-12) -> LogisticRegression:
    """sklearn's l2 logistic regression with our penalty sum NLL + lam/2 ||W||^2. With C > 2 classes it is
    multinomial (C = 1/lam); with 2 it fits one weight vector w = W_1 - W_0, and the symmetric minimiser
    W = (-w/2, w/2) of our multinomial penalty makes it lam/4 ||w||^2, so C = 2/lam."""
    C = (2.0 if num_classes == 2 else 1.0) / lam
    return LogisticRegression(C=C, tol=tol, max_iter=10000).fit(x, t, sample_weight=weight)


def full_proba(model: LogisticRegression, x: np.ndarray, num_classes: int) -> np.ndarray:
    """predict_proba with a column for every class (zeros for classes absent from the fit)."""
    out = np.zeros((len(x), num_classes))
    out[:, model.classes_] = model.predict_proba(x)
    return out


def planted_targets(x: torch.Tensor, subsets: list[list[int]], num_classes: int, gen: torch.Generator,
                    scale: float = 1.5) -> torch.Tensor:
    """Targets [R, N] from random multinomial logistic models on each subset's columns."""
    rows = []
    for s in subsets:
        w = scale * torch.randn(len(s), num_classes, generator=gen, dtype=torch.float64)
        p = (x[:, s] @ w).softmax(-1) if s else torch.full((len(x), num_classes), 1 / num_classes)
        rows.append(torch.multinomial(p, 1, generator=gen)[:, 0])
    return torch.stack(rows)


@pytest.mark.parametrize("num_classes", [2, 4])
def test_fit_logistic_equals_sklearn_one_at_a_time(num_classes: int) -> None:
    gen = torch.Generator().manual_seed(num_classes)
    N, D = 120, 6
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    subsets = [[0, 2], [5], [3, 4, 1], []]
    target = planted_targets(x, subsets, num_classes, gen)
    lam = torch.tensor([0.05, 4.0], dtype=torch.float64)
    weight = torch.stack([torch.ones(N, dtype=torch.float64), (torch.arange(N) % 5 != 2).double()])
    padded = pad_subsets(subsets, D)
    design = design_of(x, padded)
    theta = fit_logistic(design, target, num_classes, lam, weight)
    assert theta.shape == (2, 2, len(subsets), padded.shape[1] + 1, num_classes)
    z = torch.cat([design, design.new_ones(len(subsets), N, 1)], -1)
    probs = torch.einsum("rnq,fgrqc->fgrnc", z, theta).softmax(-1)
    for (f, w), (g, lm), (r, s) in itertools.product(enumerate(weight), enumerate(lam.tolist()), enumerate(subsets)):
        xs = x[:, s].numpy() if s else np.zeros((N, 1))  # sklearn needs a column; a zero one is inert
        ref = full_proba(sklearn_probs(xs, target[r].numpy(), num_classes, lm, w.numpy()), xs, num_classes)
        np.testing.assert_allclose(probs[f, g, r].numpy(), ref, rtol=0, atol=1e-4, err_msg=f"{f} {g} {r}")


@pytest.mark.parametrize("num_classes", [2, 3, 4])
def test_newton_step_in_sum_zero_coordinates_equals_the_full_newton_step(num_classes: int) -> None:
    """``_newton_step`` solves in the C - 1 class-sums-zero coordinates: at a theta in that subspace its step and
    decrement are the full Newton step's (H by autograd on every (q, c), plus the penalty; H^-1 g by least squares
    on the subspace: the full H of the likelihood alone is singular along theta_c + t)."""
    gen = torch.Generator().manual_seed(num_classes)
    R, N, P, C = 3, 40, 2, num_classes
    design = torch.randn(R, N, P, generator=gen, dtype=torch.float64)
    target = torch.randint(0, C, (R, N), generator=gen)
    wt = torch.rand(2, 1, R, N, 1, generator=gen, dtype=torch.float64)
    pen = torch.tensor([0.3, 0.3, 1e-6], dtype=torch.float64)[None, None, None, :, None]
    theta = torch.randn(2, 1, R, P + 1, C, generator=gen, dtype=torch.float64)
    theta = theta - theta.mean(-1, keepdim=True)  # in the subspace, as every iterate from 0 is
    z = torch.cat([design, design.new_ones(R, N, 1)], -1)
    onehot = torch.nn.functional.one_hot(target, C).double()
    iq, jq = torch.triu_indices(P + 1, P + 1)

    def objective(th: torch.Tensor) -> torch.Tensor:
        logp = torch.einsum("rnq,fgrqc->fgrnc", z, th).log_softmax(-1)
        return -(wt * onehot * logp).sum() + 0.5 * (pen * th.pow(2)).sum()

    logp = torch.einsum("rnq,fgrqc->fgrnc", z, theta).log_softmax(-1)
    step, decrement = _newton_step(z, z[..., iq] * z[..., jq], onehot, wt, pen, theta, logp)
    grad = torch.autograd.functional.jacobian(objective, theta)
    hess = torch.autograd.functional.hessian(objective, theta).reshape(theta.numel(), theta.numel())
    full = torch.linalg.lstsq(hess, grad.reshape(-1, 1)).solution.view_as(theta)  # H is block-diagonal over models
    # H's condition number is about 1e7 (the bias's penalty 1e-6), so the reference itself is only good to about
    # 1e7 x 54 x float64's eps ~ 1e-7 relative: rtol 1e-7 failed on one entry of 54 in a fresh clone (2.4e-7)
    torch.testing.assert_close(step, full, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(step.sum(-1), torch.zeros_like(step[..., 0]), rtol=0, atol=1e-10)
    torch.testing.assert_close(decrement, 0.5 * (grad * full).sum((-1, -2)), rtol=1e-6, atol=1e-10)


def sklearn_cv(x: np.ndarray, t: np.ndarray, num_classes: int, lambdas: tuple[float, ...], fold: np.ndarray
               ) -> tuple[int, np.ndarray]:
    """The grid index with the best summed held-out log-likelihood, and its whole-data probabilities."""
    cv = []
    for lam in lambdas:
        total = 0.0
        for f in range(fold.max() + 1):
            tr, te = fold != f, fold == f
            p = full_proba(sklearn_probs(x[tr], t[tr], num_classes, lam), x[te], num_classes)
            total += float(np.log(np.maximum(p[np.arange(te.sum()), t[te]], 1e-300)).sum())
        cv.append(total)
    best = int(np.argmax(cv))
    return best, full_proba(sklearn_probs(x, t, num_classes, lambdas[best]), x, num_classes)


def assert_cv_equals_sklearn_cv(x: torch.Tensor, target: torch.Tensor, subsets: list[list[int]], C: int, k: int,
                                seed: int) -> None:
    """``logistic_cv_log_probs`` chooses sklearn's penalty for each regression (over the same folds, a fit per
    fold, lambda and regression) and gives its whole-data probabilities; and the choices differ."""
    N, D = x.shape
    out, ours = logistic_cv_log_probs(x, target, pad_subsets(subsets, D), C, LAMBDA_GRID, cv_folds=k, seed=seed)
    assert out.shape == (len(subsets), N, C)
    fold = fold_assignment(N, k, seed).numpy()
    chosen = []
    for r, s in enumerate(subsets):
        best, ref = sklearn_cv(x[:, s].numpy(), target[r].numpy(), C, LAMBDA_GRID, fold)
        chosen.append(best)
        np.testing.assert_allclose(out[r].exp().numpy(), ref, rtol=0, atol=1e-4, err_msg=f"regression {r}")
    assert ours.tolist() == chosen
    assert len(set(chosen)) > 1, chosen  # the CV really chooses (not one grid value for all)


def test_newton_ends_when_no_open_models_line_search_finds_a_decrease(monkeypatch) -> None:
    """A model whose line search finds no decrease (rounding, with a decrement still above the tolerance) is closed;
    once every open model is, Newton's loop ends where they are (it had gone on to an empty block of regressions and
    failed to reshape it: the pair regressions of delicious' rows, a chunk whose last open model stalled)."""
    from structtorch.estimation import conditionals

    def no_decrease(value, f, slope, active):
        return torch.zeros_like(f), value(torch.zeros_like(f))

    monkeypatch.setattr(conditionals, "backtrack", no_decrease)
    gen = torch.Generator().manual_seed(0)
    design = torch.randn(2, 40, 2, generator=gen, dtype=torch.float64)
    target = torch.randint(0, 3, (2, 40), generator=gen)
    lam, weight = torch.tensor([1.0, 0.1], dtype=torch.float64), torch.ones(3, 40, dtype=torch.float64)
    assert torch.equal(fit_logistic(design, target, 3, lam, weight), torch.zeros(3, 2, 2, 3, 3, dtype=torch.float64))


def test_logistic_cv_equals_sklearn_cv_over_the_same_folds() -> None:
    gen = torch.Generator().manual_seed(11)
    N, D = 150, 5
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    subsets = [[0, 1], [2], [3, 4, 0]]
    target = torch.cat([planted_targets(x, subsets[:2], 4, gen, scale=2.0),
                        torch.randint(0, 4, (1, N), generator=gen)])  # the last one is noise: a large lambda
    assert_cv_equals_sklearn_cv(x, target, subsets, 4, k=3, seed=7)


def test_logistic_cv_on_repeated_binary_rows_equals_sklearn_cv_on_every_row() -> None:
    """Sparse binary inputs (word counts) repeat rows: each regression is fitted on its distinct rows weighted by
    their counts per fold (``distinct_rows``), which must give the per-row fits and CV choices."""
    gen = torch.Generator().manual_seed(5)
    N, D = 240, 6
    x = (torch.rand(N, D, generator=gen) < 0.15).double()
    subsets = [[0, 1, 2], [3], [4, 5, 0]]
    target = torch.cat([planted_targets(x, subsets[:2], 4, gen, scale=3.0),
                        torch.randint(0, 4, (1, N), generator=gen)])
    for (inputs, t, inverse), s, tr in zip(distinct_rows(x, target, pad_subsets(subsets, D)), subsets, target):
        assert len(inputs) < N / 4  # the case the compression is for
        assert torch.equal(inputs[inverse][:, :len(s)], x[:, s]) and torch.equal(t[inverse], tr)
    assert_cv_equals_sklearn_cv(x, target, subsets, 4, k=3, seed=1)


@pytest.mark.parametrize("binary", [True, False])
def test_distinct_rows_by_one_sort_of_keys_equal_unique_rows(binary: bool) -> None:
    """Coded columns that fit one 63-bit key (binary, word-like x) go through one batched sort of keys, the others
    (continuous x: 20 columns of 150 values) through ``torch.unique`` per regression: the same distinct rows."""
    gen = torch.Generator().manual_seed(3)
    N, D = 150, 30
    x = (torch.rand(N, D, generator=gen) < 0.2).double() if binary else torch.randn(N, D, generator=gen).double()
    subsets = pad_subsets([list(range(20)), [4, 7], [29], list(range(10, 30))], D)
    target = torch.randint(0, 4, (len(subsets), N), generator=gen)
    for (inputs, t, inverse), cols, tr in zip(distinct_rows(x, target, subsets), subsets, target):
        xz = torch.cat([x, torch.zeros(N, 1, dtype=x.dtype)], 1)
        assert torch.equal(inputs[inverse], xz[:, cols]) and torch.equal(t[inverse], tr)
        assert len(inputs) == len(torch.unique(torch.cat([xz[:, cols], tr[:, None].double()], 1), dim=0))


# ---------------------------------------------------------------------- count tables, estimator choice
def hand_count(x: np.ndarray, t: np.ndarray, s: list[int], num_classes: int) -> np.ndarray:
    """(count(config, c) + 1) / (count(config) + C) at every example, by Python loops."""
    keys = [tuple(row) for row in x[:, s]]
    out = np.zeros((len(x), num_classes))
    for n, key in enumerate(keys):
        match = [m for m, other in enumerate(keys) if other == key]
        for c in range(num_classes):
            out[n, c] = (sum(t[m] == c for m in match) + 1) / (len(match) + num_classes)
    return out


@settings(max_examples=15, deadline=None)
@given(N=st.integers(1, 25), card=st.lists(st.integers(1, 3), min_size=3, max_size=3),
       num_classes=st.integers(2, 4), seed=st.integers(0, 2**31 - 1))
def test_table_log_probs_equal_hand_counts(N: int, card: list[int], num_classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = np.stack([rng.integers(0, c, N) for c in card], 1)
    subsets = [[0], [2, 1], [], [1, 0, 2]]
    t = rng.integers(0, num_classes, (len(subsets), N))
    got = table_log_probs(torch.from_numpy(x).float(), torch.from_numpy(t), pad_subsets(subsets, 3), num_classes)
    for r, s in enumerate(subsets):
        np.testing.assert_allclose(got[r].exp().numpy(), hand_count(x, t[r], s, num_classes), rtol=1e-12, atol=0)


def test_table_log_probs_small_example_by_hand() -> None:
    x = torch.tensor([[0.0], [0.0], [0.0], [1.0]])
    t = torch.tensor([[1, 1, 0, 0]])
    got = table_log_probs(x, t, pad_subsets([[0]], 1), 2).exp()
    want = torch.tensor([[2 / 5, 3 / 5]] * 3 + [[2 / 3, 1 / 3]], dtype=torch.float64)
    torch.testing.assert_close(got[0], want, rtol=1e-12, atol=0)


def test_auto_estimator_choice() -> None:
    gen = torch.Generator().manual_seed(2)
    N = 60
    binary = torch.randint(0, 2, (N, 3), generator=gen).float()
    target = torch.randint(0, 4, (2, N), generator=gen)
    subsets = pad_subsets([[0, 1], [2]], 3)
    auto = conditional_log_probs(binary, target, subsets, 4, cv_folds=3)
    torch.testing.assert_close(auto, table_log_probs(binary, target, subsets, 4), rtol=0, atol=0)
    at_limit = conditional_log_probs(binary, target, subsets, 4, cv_folds=3, max_table_cells=4)  # 2 x 2 cells
    torch.testing.assert_close(at_limit, auto, rtol=0, atol=0)
    # too many cells for the table (4 > 3): logistic on the standardised inputs
    standard = (binary.double() - binary.double().mean(0)) / binary.double().std(0, unbiased=False)
    logistic = logistic_cv_log_probs(standard, target, subsets, 4, cv_folds=3)[0]
    torch.testing.assert_close(conditional_log_probs(binary, target, subsets, 4, cv_folds=3, max_table_cells=3),
                               logistic, rtol=0, atol=1e-12)
    continuous = torch.randn(N, 3, generator=gen, dtype=torch.float64)
    standard = (continuous - continuous.mean(0)) / continuous.std(0, unbiased=False)
    torch.testing.assert_close(conditional_log_probs(continuous, target, subsets, 4, cv_folds=3),
                               logistic_cv_log_probs(standard, target, subsets, 4, cv_folds=3)[0], rtol=0,
                               atol=1e-12)


# ---------------------------------------------------------------------- end to end on synthetic tree CRFs
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimated_scores_approach_exact_on_tractable_tree(seed: int) -> None:
    """2000 samples of the tractable joint (tables): every score within 0.06 of its exact value. (DCI's
    exact tree itself recovers only 2-4 of the 7 edges of these models: the SDA fails, not the estimate.)"""
    data = tree_crf_synthetic(num_train=2000, num_test=10, num_labels=8, joint="tractable", seed=seed)
    P = model_joint(data)
    for method in ("piecewise", "local_cmi", "dci"):
        est = edge_scores(data.x_train, data.y_train, method, inputs=data.inputs)
        assert (est - exact_scores(P, 8, method)).abs().max() < 0.06, method


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dci_recovers_most_of_the_tree(seed: int) -> None:
    """The paper's synthetic setting (intractable joint, alternating +-4/+-2/+-1, cross factors), 8 labels,
    2000 samples: DCI's tree shares >= 5 of 7 edges (a uniform random tree shares 7 * 2/8 = 1.75 on
    average), as does the tree of its exact scores."""
    data = tree_crf_synthetic(num_train=2000, num_test=10, num_labels=8, joint="intractable", seed=seed)
    truth = data.tree_edge_mask()
    est = edge_scores(data.x_train, data.y_train, "dci", inputs=data.inputs)
    assert int((recovered(est, 8) & truth).sum()) >= 5
    exact = exact_scores(joint_intractable(data), 8, "dci")
    assert int((recovered(exact, 8) & truth).sum()) >= 5


def test_chow_liu_equals_label_mutual_information() -> None:
    data = tree_crf_synthetic(num_train=2000, num_test=10, num_labels=8, joint="tractable", seed=4)
    got = edge_scores(data.x_train, data.y_train, "chow_liu", inputs=data.inputs)
    torch.testing.assert_close(got, label_mutual_information(data.y_train, 2), rtol=0, atol=0)
    assert torch.equal(recovered(got, 8), data.tree_edge_mask())


@pytest.fixture(scope="module")
def continuous_data() -> tuple[torch.Tensor, torch.Tensor]:
    """x [150, 6] Gaussian; y_0 follows column 3, y_1 column 5 (with noise), y_2 is y_0 XOR noise."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(150, 6, generator=gen, dtype=torch.float64)
    noise = lambda: 0.5 * torch.randn(150, generator=gen, dtype=torch.float64)  # noqa: E731
    y0, y1 = (x[:, 3] + noise() > 0).long(), (x[:, 5] + noise() > 0).long()
    y2 = y0 ^ (torch.rand(150, generator=gen) < 0.2).long()
    return x, torch.stack([y0, y1, y2], 1)


@pytest.mark.parametrize("method", EDGE_SCORES)
def test_every_method_gives_finite_scores(method: str, continuous_data) -> None:
    x, y = continuous_data
    scores = edge_scores(x, y, method, num_inputs=2, cv_folds=3, lambdas=LAMBDA_GRID[::3])
    assert scores.shape == (3,) and scores.dtype == torch.float64
    assert bool(torch.isfinite(scores).all())


def test_global_cmi_is_local_cmi_with_every_input(continuous_data) -> None:
    x, y = continuous_data
    fit = dict(cv_folds=3, lambdas=LAMBDA_GRID[::3])
    every = [list(range(x.shape[1]))] * y.shape[1]
    torch.testing.assert_close(edge_scores(x, y, "global_cmi", inputs=[[0], [1], [2]], **fit),
                               edge_scores(x, y, "local_cmi", inputs=every, **fit), rtol=0, atol=1e-12)


def test_a_spent_time_budget_keeps_the_scores_of_the_most_dependent_pairs(monkeypatch) -> None:
    """Pairs are scored by decreasing mutual information; once the run's time budget is spent (after the first
    batch of 2 pairs here) the rest score -inf, the scored ones as without a budget, and TreeCRF's structure leaves
    the unscored pairs out (a forest); DCI's node regressions are fitted for the scored pairs' labels only.
    Before: the scores (and the 983 node regressions) ran on far past trainer.time_budget (delicious)."""
    from structtorch.learners import TreeCRF
    from structtorch.progress import time_budget

    module = importlib.import_module("structtorch.estimation.edge_scores")
    data = tree_crf_synthetic(120, 10, num_labels=5, seed=3)
    x = data.x_train + 0.1 * torch.randn(data.x_train.shape, generator=torch.Generator().manual_seed(0),
                                         dtype=data.x_train.dtype)
    y, fit = data.y_train, dict(inputs=data.inputs, cv_folds=3, lambdas=LAMBDA_GRID[::3])
    monkeypatch.setattr(module, "PAIR_BATCH_ELEMENTS", 2 * len(y) * 4)
    full = edge_scores(x, y, "dci", **fit)
    fitted, conditional = [], module.conditional_log_probs
    monkeypatch.setattr(module, "conditional_log_probs",
                        lambda x, target, *a, **k: (fitted.append(len(target)), conditional(x, target, *a, **k))[1])
    with time_budget(1e-9):
        cut = edge_scores(x, y, "dci", **fit)
    first = label_mutual_information(y).argsort(descending=True, stable=True)[:2]
    assert torch.equal(cut.isfinite().nonzero()[:, 0].sort().values, first.sort().values)
    labels = Graph.complete(5).edges[first].unique()
    assert fitted == [2, len(labels)]  # one batch of pairs, and P(y_i | X_i) of its labels only
    torch.testing.assert_close(cut[first], full[first], rtol=1e-6, atol=1e-9)
    model = TreeCRF(x.shape[1], 5, inputs="l1", num_inputs=3, score="dci")
    model.set_candidates(Graph.complete(5))
    with time_budget(1e-9):
        tree = model.build_structure(x, y)
    assert 1 <= int(tree.sum()) <= 2 and bool(model.edge_score[tree].isfinite().all())


@pytest.mark.parametrize("method", ["dci", "local_cmi", "chow_liu"])
def test_scores_on_a_graph_in_batches_equal_the_complete_graphs_on_its_edges(method: str, monkeypatch) -> None:
    """Scores restricted to a candidate graph, computed two pairs per batch, equal the one-batch scores of the
    complete graph on those edges (the pairs' regressions are independent)."""
    module = importlib.import_module("structtorch.estimation.edge_scores")  # the package exports the function
    data = tree_crf_synthetic(120, 10, num_labels=5, seed=3)
    x, y = data.x_train, data.y_train
    x = x + 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=x.dtype)  # logistic fits
    fit = dict(inputs=data.inputs, cv_folds=3, lambdas=LAMBDA_GRID[::3])
    complete = edge_scores(x, y, method, **fit)
    graph = Graph(5, torch.tensor([[0, 1], [1, 4], [2, 3], [0, 4], [3, 4]]))
    monkeypatch.setattr(module, "PAIR_BATCH_ELEMENTS", 2 * len(y) * 4)
    on_graph = edge_scores(x, y, method, graph=graph, **fit)
    position = {tuple(e): k for k, e in enumerate(Graph.complete(5).edges.tolist())}
    expected = complete[[position[tuple(e)] for e in graph.edges.tolist()]]
    torch.testing.assert_close(on_graph, expected, rtol=1e-6, atol=1e-9)


def test_select_inputs_size_and_planted_columns(continuous_data) -> None:
    x, y = continuous_data
    inputs = select_inputs(x, y, 3)
    assert len(inputs) == 3
    for cols in inputs:
        assert len(cols) == 3 and len(set(cols)) == 3 and all(0 <= c < 6 for c in cols)
    assert 3 in inputs[0] and 5 in inputs[1] and 3 in inputs[2]
    assert [len(c) for c in select_inputs(x, y, 10)] == [6, 6, 6]  # capped at D


# ---------------------------------------------------------------------- bad input
def _xy() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(20, 3, generator=gen), torch.randint(0, 2, (20, 3), generator=gen)


BAD_CALLS = {
    "unknown method": (lambda x, y: edge_scores(x, y, "mutual"), "method must be one of"),
    "y float": (lambda x, y: edge_scores(x, y.float(), "dci"), "integer labels"),
    "y 1-D": (lambda x, y: edge_scores(x, y[:, 0], "dci"), "y must be"),
    "y negative": (lambda x, y: edge_scores(x, y - 1, "dci"), r"labels in \[0"),
    "x wrong N": (lambda x, y: edge_scores(x[:-1], y, "dci"), "x must be"),
    "x non-finite": (lambda x, y: edge_scores(x.index_fill(0, torch.tensor([3]), math.nan), y, "dci"),
                     "x must be finite"),
    "inputs wrong length": (lambda x, y: edge_scores(x, y, "dci", inputs=[[0], [1]]), "inputs must give"),
    "inputs empty list": (lambda x, y: edge_scores(x, y, "local_cmi", inputs=[[0], [], [2]]), "non-empty"),
    "inputs out of range": (lambda x, y: edge_scores(x, y, "dci", inputs=[[0], [1], [3]]), r"in \[0, 3\)"),
    "estimator name": (lambda x, y: edge_scores(x, y, "dci", inputs=[[0], [1], [2]], estimator="tree"),
                       "estimator must be"),
    "table on continuous x": (lambda x, y: edge_scores(x, y, "dci", inputs=[[0], [1], [2]], estimator="table"),
                              "non-negative integers"),
    "cv_folds 1": (lambda x, y: edge_scores(x, y, "dci", inputs=[[0], [1], [2]], cv_folds=1), "cv_folds must be"),
    "cv_folds > N": (lambda x, y: edge_scores(x, y, "dci", inputs=[[0], [1], [2]], cv_folds=21), "cv_folds must be"),
    "pad_subsets out of range": (lambda x, y: pad_subsets([[0, 1], [5]], 3), r"subset 1 .* in \[0, 3\)"),
    "pad_subsets negative": (lambda x, y: pad_subsets([[-1]], 3), r"in \[0, 3\)"),
    "pad_subsets duplicate": (lambda x, y: pad_subsets([[1, 1]], 3), "distinct"),
    "dci without log_node": (lambda x, y: scores_from_log_probs("dci", torch.zeros(3, 20, 2, 2), y), "log_node"),
    "log_pair shape": (lambda x, y: scores_from_log_probs("piecewise", torch.zeros(2, 20, 2, 2), y), "log_pair"),
    "scores of chow_liu": (lambda x, y: scores_from_log_probs("chow_liu", torch.zeros(3, 20, 2, 2), y), "method"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_value_error(case: str) -> None:
    call, match = BAD_CALLS[case]
    with pytest.raises(ValueError, match=match):
        call(*_xy())
