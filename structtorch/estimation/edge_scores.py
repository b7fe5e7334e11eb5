"""Regression-based edge scores over label pairs, for tree-CRF structure learning.

``edge_scores`` weights every edge of a label graph (``Graph.complete(n)``, or a candidate graph of each label's most
dependent partners when the labels are many) for the max-spanning-tree structure learner of Bradley & Guestrin
(ICML 2010, Algorithm 1), from estimated conditionals (``conditionals``):

- piecewise: E[log P(Y_ij | X_ij)]                                          (Sec. 4.1)
- local_cmi: I(Y_i; Y_j | X_ij) = E[log P(Y_ij|X_ij) - log P(Y_i|X_ij) - log P(Y_j|X_ij)]   (Sec. 4.2)
- dci:       E[log P(Y_ij | X_ij)] - E[log P(Y_i | X_i) + log P(Y_j | X_j)]   (Sec. 4.3)
- global_cmi: I(Y_i; Y_j | X), the local CMI with X_ij = all inputs         (Sec. 3); its n(n-1)/2
  regressions on all D inputs are the expensive part (the paper's "prohibitive" baseline): about a
  minute for emotions (72 inputs) on a 2-core CPU, far more for hundreds of inputs
- chow_liu:  I(Y_i; Y_j), no inputs (the generative baseline: ``structure.label_mutual_information``)

X_i is label i's input columns (the input mapping), X_ij = X_i u X_j. P(Y_i | X_ij) is the marginal of
the fitted P(Y_ij | X_ij), so local and global CMI come from the same pair regressions as the
piecewise score. Expectations are means over the training examples. The pair regressions run in batches of at most
``PAIR_BATCH_ELEMENTS`` log-probabilities (E_batch N K^2), so memory does not grow with the number of pairs.
"""

from __future__ import annotations

import logging

import torch

from ..energies.local import pad_subsets, pair_inputs
from ..graph import Graph
from ..progress import phase, tick
from ..structure.edge_scores import dependence_order, label_mutual_information
from .conditionals import LAMBDA_GRID, conditional_log_probs, select_inputs, tables_fit

__all__ = ["EDGE_SCORES", "PAIR_BATCH", "PAIR_BATCH_ELEMENTS", "edge_scores", "scores_from_log_probs"]

log = logging.getLogger(__name__)

#: log-probabilities P(y_i, y_j | x_n) per batch of pair regressions (E_batch N K^2 float64: 128 MiB)
PAIR_BATCH_ELEMENTS = 1 << 24

#: pairs per batch at most, so a spent time budget stops the scores within a batch of this size
PAIR_BATCH = 128

#: the ``method`` names of ``edge_scores``
EDGE_SCORES = ("piecewise", "local_cmi", "dci", "global_cmi", "chow_liu")


def edge_scores(x: torch.Tensor, y: torch.Tensor, method: str, inputs: list[list[int]] | None = None,
                num_states: int | None = None, num_inputs: int = 10, estimator: str = "auto",
                lambdas: tuple[float, ...] = LAMBDA_GRID, cv_folds: int = 5, seed: int = 0,
                graph: Graph | None = None) -> torch.Tensor:
    """Edge scores [E] on the edges of ``graph`` (default ``Graph.complete(n)``; higher = keep); feed them to
    ``max_spanning_tree(scores, graph)``.

    x [N, D] float, y [N, n] long in [0, K); method in ``EDGE_SCORES``; inputs: label i's input columns
    (a list of n lists of column indices), None = the ``num_inputs`` columns with the largest weights
    of an l1 logistic regression per label (``select_inputs``). The conditionals are count tables
    or l2 logistic regressions with the penalty chosen per regression by ``cv_folds``-fold CV over
    ``lambdas`` (``conditional_log_probs``, ``estimator``), the regressions of a batch of pairs fitted as one
    batched model. K = ``num_states`` or y.max() + 1 (at least 2). Pairs are scored in decreasing order of
    their labels' mutual information; once the running ``time_budget`` is spent (``trainer.time_budget``: at
    most half of it goes to structure learning), the pairs not yet scored get -inf.
    """
    if method not in EDGE_SCORES:
        raise ValueError(f"method must be one of {EDGE_SCORES}, got {method!r}")
    y = _check_y(y, num_states)
    K = num_states or max(int(y.max()) + 1, 2)
    N, n = y.shape
    graph = Graph.complete(n) if graph is None else graph
    if graph.num_nodes != n or graph.is_ensemble:
        raise ValueError(f"graph must be a single graph on the n={n} labels, got {graph}")
    if method == "chow_liu":
        return label_mutual_information(y, K, graph=graph)
    x = _check_x(x, y)
    edges = graph.edges
    if method == "global_cmi":
        pair_cols = [list(range(x.shape[1]))] * len(edges)
    else:
        inputs = select_inputs(x, y, num_inputs) if inputs is None else _check_inputs(inputs, n)
        pair_cols = pair_inputs(inputs, edges)
    fit = dict(lambdas=lambdas, cv_folds=cv_folds, seed=seed)
    node = _NodeConditionals(x, y, inputs, K, estimator, fit) if method == "dci" else None
    if estimator == "auto":  # one estimator for every batch of pairs, so their scores compare
        estimator = "table" if tables_fit(x, pad_subsets(pair_cols, x.shape[1])) else "logistic"
    fit["estimator"] = estimator
    order = dependence_order(y, graph, K)
    scores = torch.full((len(edges),), float("-inf"), dtype=torch.float64, device=y.device)
    batch = max(1, min(PAIR_BATCH, PAIR_BATCH_ELEMENTS // (N * K * K)))
    with phase("P(y_i, y_j | inputs)", quiet=True):
        for lo in range(0, len(edges), batch):
            ids = order[lo:lo + batch]
            e, cols = edges[ids], [pair_cols[i] for i in ids.tolist()]
            target = (y[:, e[:, 0]] * K + y[:, e[:, 1]]).T  # [E_batch, N]
            log_pair = conditional_log_probs(x, target, pad_subsets(cols, x.shape[1]).to(x.device), K * K,
                                             **fit).view(len(e), N, K, K)
            log_node = None if node is None else node.of(e.unique())
            scores[ids.to(y.device)] = scores_from_log_probs(method, log_pair, y, log_node, edges=e).to(scores)
            if not tick(lo + len(e), len(edges), "label pairs") and lo + len(e) < len(edges):
                log.warning("edge scores: the run's time budget is spent after %d of %d label pairs (the most "
                            "dependent first); the others score -inf", lo + len(e), len(edges))
                break
    return scores


class _NodeConditionals:
    """DCI's log P(Y_i = a | X_i = x_n) [n, N, K], fitted for a label when a batch of pairs first needs it (a
    budget that stops the pairs early also spares the labels they do not touch). Each label's regression is
    independent of the others' (same folds and estimator), so the order does not change them."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, inputs: list[list[int]], K: int, estimator: str,
                 fit: dict) -> None:
        self.x, self.y, self.K = x, y, K
        self.subsets = pad_subsets(inputs, x.shape[1]).to(x.device)
        if estimator == "auto":  # decided once over every label
            estimator = "table" if tables_fit(x, self.subsets) else "logistic"
        self.fit = fit | {"estimator": estimator}
        self.log = torch.zeros(y.shape[1], y.shape[0], K, dtype=torch.float64, device=y.device)
        self.done = torch.zeros(y.shape[1], dtype=torch.bool, device=y.device)

    def of(self, labels: torch.Tensor) -> torch.Tensor:
        """The table [n, N, K] with the rows of ``labels`` (LongTensor) fitted."""
        new = labels.to(self.done.device)[~self.done[labels.to(self.done.device)]]
        if len(new):
            with phase("P(y_i | inputs)", quiet=True):
                self.log[new] = conditional_log_probs(self.x, self.y.T[new], self.subsets[new.to(self.x.device)],
                                                      self.K, **self.fit).to(self.log)
            self.done[new] = True
        return self.log


def scores_from_log_probs(method: str, log_pair: torch.Tensor, y: torch.Tensor, log_node: torch.Tensor | None = None,
                          weight: torch.Tensor | None = None, edges: torch.Tensor | None = None) -> torch.Tensor:
    """The edge scores [E] of ``method`` (not chow_liu) from conditionals at the examples.

    log_pair [E, N, K, K]: log P(Y_i = a, Y_j = b | x_n) for the label pairs ``edges`` [E, 2] (default: the
    edges of ``Graph.complete(n)``); log_node [n, N, K]: log P(Y_i = a | X_i = x_n) (DCI only); y [N, n] long;
    weight [N]: example weights of the expectations (default uniform; e.g. exact probabilities of enumerated
    examples).
    """
    N, n = y.shape
    edges = (Graph.complete(n).edges if edges is None else edges).to(y.device)
    E, K = len(edges), log_pair.shape[-1]
    if log_pair.shape != (E, N, K, K):
        raise ValueError(f"log_pair must have shape [{E}, {N}, K, K], got {tuple(log_pair.shape)}")
    w = torch.full((N,), 1.0 / N, dtype=log_pair.dtype, device=y.device) if weight is None else weight / weight.sum()
    yi, yj = y[:, edges[:, 0]].T, y[:, edges[:, 1]].T  # [E, N]
    piecewise = log_pair.flatten(2).gather(2, (yi * K + yj)[..., None])[..., 0]  # [E, N]
    if method == "piecewise":
        correction = 0.0
    elif method in ("local_cmi", "global_cmi"):
        correction = (log_pair.logsumexp(3).gather(2, yi[..., None])[..., 0]
                      + log_pair.logsumexp(2).gather(2, yj[..., None])[..., 0])
    elif method == "dci":
        if log_node is None:
            raise ValueError("method='dci' needs log_node [n, N, K]")
        at = log_node.gather(2, y.T[..., None])[..., 0]  # [n, N]
        correction = at[edges[:, 0]] + at[edges[:, 1]]
    else:
        raise ValueError(f"method must be one of {EDGE_SCORES[:-1]}, got {method!r}")
    return ((piecewise - correction) * w).sum(1)


def _check_y(y: torch.Tensor, num_states: int | None) -> torch.Tensor:
    if not isinstance(y, torch.Tensor) or y.dim() != 2 or y.shape[1] < 2 or y.shape[0] < 2:
        raise ValueError(f"y must be a LongTensor [N >= 2, n >= 2], got {getattr(y, 'shape', type(y))}")
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError(f"y must hold integer labels, got {y.dtype}")
    K = num_states or max(int(y.max()) + 1, 2)
    if int(y.min()) < 0 or int(y.max()) >= K:
        raise ValueError(f"y must hold labels in [0, {K}), got min {int(y.min())}, max {int(y.max())}")
    return y.long()


def _check_x(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] != y.shape[0] or x.shape[1] < 1:
        raise ValueError(f"x must be a float tensor [N={y.shape[0]}, D >= 1], got {getattr(x, 'shape', type(x))}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x must be finite")
    return x.to(torch.float64)


def _check_inputs(inputs: list[list[int]], n: int) -> list[list[int]]:
    if len(inputs) != n or any(len(s) == 0 for s in inputs):
        raise ValueError(f"inputs must give a non-empty list of input columns for each of the {n} labels")
    return [[int(c) for c in s] for s in inputs]
