"""Structured losses on Potentials: hinge with Hamming or 0/1 margin rescaling, CRF negative log-likelihood.

Every loss is checked by ``check_loss_finite``: an example whose label is impossible
(score(y) = -inf) or that has no feasible assignment at all raises a ValueError naming the
example, instead of a +inf / NaN loss that would silently poison training.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .graph import check_float
from .inference import smoothed_lp, tree_logz, tree_map
from .potentials import Potentials

__all__ = ["hamming_margin", "hamming_augment", "structured_hinge", "smoothed_lp_hinge", "zero_one_hinge",
           "total_score", "crf_nll", "map_value", "check_loss_finite"]

MaxFn = Callable[[Potentials], torch.Tensor]
#: (Potentials [*B], y [*B, n]) -> the best assignment other than y [*B, n] (the worst violator)
ViolatorFn = Callable[[Potentials, torch.Tensor], torch.Tensor]

_MAX_LISTED = 5  # examples described in a non-finite-loss error


def map_value(pot: Potentials) -> torch.Tensor:
    """max_y score(y) [*B] on a tree or forest (tree_map's differentiable score)."""
    return tree_map(pot)[0]


def hamming_margin(y: torch.Tensor, num_states: int, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Delta(y, .) per state [*B, n, K] of labels y [*B, n]: ``scale`` on every state other than y_i, 0 on y_i,
    so the Hamming loss of an assignment is the sum of its states' entries. Adding it to the unary scores is
    margin rescaling (``hamming_augment``; the solvers' primal and Domke's biases add it to their own)."""
    return scale * (1.0 - torch.nn.functional.one_hot(y, num_states).to(dtype))


def hamming_augment(pot: Potentials, y: torch.Tensor, scale: float = 1.0) -> Potentials:
    """Loss-augmented potentials: + scale on every unary state that differs from y [*B, n] (``hamming_margin``).

    Ensembles with a per-graph unary [*B, T, n, K] get the same augmentation on every graph.
    """
    check_float(scale, "scale", finite=True)
    delta = hamming_margin(pot.check_labels(y), pot.num_states, scale, pot.dtype)  # [*B, n, K]
    if pot.unary_per_graph:
        delta = delta.unsqueeze(-3)  # [*B, 1, n, K] against unary [*B, T, n, K]
    return Potentials(pot.unary + delta, pot.pairwise, pot.graph)


def structured_hinge(pot: Potentials, y: torch.Tensor, max_fn: MaxFn = map_value, scale: float = 1.0) -> torch.Tensor:
    """M3N hinge with Hamming margin rescaling [*B]:
    max_y' [score(y') + scale * Hamming(y, y')] - score(y) >= 0.

    ``max_fn`` computes the loss-augmented max: ``map_value`` (exact, trees), or an upper bound
    such as the smoothed LP value on loopy graphs (the loss stays an upper bound on the hinge).
    Raises ValueError (``check_loss_finite``) for an example whose label y is impossible or that
    has no feasible assignment.
    """
    loss = max_fn(hamming_augment(pot, y, scale)) - pot.score(y)
    return check_loss_finite(loss, pot, y, "structured_hinge")


def smoothed_lp_hinge(pot: Potentials, y: torch.Tensor, eps: float, iters: int, messages: torch.Tensor | None = None,
                      tol: float | None = None, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The entropy-smoothed LP hinge [*B] (Domke's eq. 6, CRANK's Full): ``smoothed_lp``'s value on the
    Hamming-augmented potentials (an upper bound on the LP-relaxed loss-augmented max) minus score(y), after
    ``iters`` sweeps from ``messages`` [*B, E, 2, K] (None: zeros); and the messages it ended at (the next call's
    warm start). Differentiable by Danskin: the gradient is the smoothed pseudo-marginals minus m(y)."""
    res = smoothed_lp(hamming_augment(pot, y, scale), eps, iters, messages=messages, tol=tol)
    return check_loss_finite(res.value - pot.score(y), pot, y, "smoothed_lp_hinge"), res.messages


def total_score(pot: Potentials, y: torch.Tensor) -> torch.Tensor:
    """score(y) [*B]; ensembles: the mean of the trees' scores (what ``ensemble_map`` maximises)."""
    s = pot.score(y)
    return s.mean(-1) if pot.graph.is_ensemble else s


def zero_one_hinge(pot: Potentials, y: torch.Tensor, violator: ViolatorFn, scale: float = 1.0) -> torch.Tensor:
    """Hinge with 0/1 margin rescaling [*B]: max(0, scale + score(y') - score(y)), y' = ``violator(pot, y)``
    the best assignment other than y (RTA's Def. 6: margin ``scale`` against the worst violator).
    Differentiable in the potentials (the violator is found without gradient)."""
    with torch.no_grad():
        y_bad = violator(pot.detach(), y)
    loss = torch.relu(scale + total_score(pot, y_bad) - total_score(pot, y))
    return check_loss_finite(loss, pot, y, "zero_one_hinge")


def crf_nll(pot: Potentials, y: torch.Tensor) -> torch.Tensor:
    """Negative conditional log-likelihood [*B]: log Z - score(y) (exact on trees).

    Raises ValueError (``check_loss_finite``) for an example whose label y is impossible
    (probability 0) or that has no feasible assignment (Z = 0).
    """
    return check_loss_finite(tree_logz(pot) - pot.score(y), pot, y, "crf_nll")


def check_loss_finite(loss: torch.Tensor, pot: Potentials, y: torch.Tensor, name: str = "loss",
                      index: torch.Tensor | None = None) -> torch.Tensor:
    """``loss`` unchanged when every entry is finite, else a ValueError naming the bad examples.

    loss: per-example loss [*B'] = (a max or log-partition term) - pot.score(y), with
        *B' = the broadcast of y's leading dims and pot.batch_shape (pot.score(y)'s shape).
    pot, y: the potentials and labels [*B, n] the loss was computed from.
    name: the loss's name in the message. index: optional LongTensor [*B'] of dataset indices,
        also named in the message.
    The hot path is one ``isfinite().all()``; only a failing call scores y again to tell
    "example i: the label y has score -inf (impossible under the potentials)" (loss +inf)
    from "example i: no feasible assignment" (loss NaN: -inf - -inf).
    """
    if bool(torch.isfinite(loss).all()):
        return loss
    raise ValueError(_non_finite_message(loss.detach(), pot, y, name, index))


def _non_finite_message(loss: torch.Tensor, pot: Potentials, y: torch.Tensor, name: str,
                        index: torch.Tensor | None) -> str:
    with torch.no_grad():
        label = pot.score(y)
    impossible = torch.isneginf(label)
    if pot.graph.is_ensemble:  # score per graph [*B, T]: the label is impossible on some graph
        impossible = impossible.any(-1)
    bad = (~torch.isfinite(loss)).nonzero().tolist()
    head = f"{name} is not finite for {len(bad)} of {loss.numel()} examples"
    if impossible.shape != loss.shape:
        return (f"{head} (loss shape {tuple(loss.shape)}, expected per-example [*B] = {tuple(impossible.shape)}); "
                f"{int(impossible.sum())} labels have score -inf")
    parts = []
    for pos in bad[:_MAX_LISTED]:
        where = f"example {pos[0]}" if len(pos) == 1 else f"example {tuple(pos)}" if pos else "the example"
        if index is not None and index.shape == loss.shape:
            where += f" (dataset index {int(index[tuple(pos)])})"
        value = float(loss[tuple(pos)])
        if not impossible[tuple(pos)]:
            reason = f"the loss is {value} although the label y has a finite score"
        elif math.isnan(value):
            reason = "no feasible assignment (every assignment has score -inf)"
        else:
            reason = "the label y has score -inf (impossible under the potentials)"
        parts.append(f"{where}: {reason}")
    more = f"; and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
    return f"{head}: " + "; ".join(parts) + more
