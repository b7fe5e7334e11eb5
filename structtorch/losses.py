"""Structured losses on Potentials: hinge with Hamming margin rescaling, CRF negative log-likelihood."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .inference import tree_logz, tree_map
from .potentials import Potentials

__all__ = ["hamming_augment", "structured_hinge", "crf_nll", "map_value"]

MaxFn = Callable[[Potentials], torch.Tensor]


def map_value(pot: Potentials) -> torch.Tensor:
    """max_y score(y) [*B] on a tree or forest (tree_map's differentiable score)."""
    return tree_map(pot)[0]


def hamming_augment(pot: Potentials, y: torch.Tensor, scale: float = 1.0) -> Potentials:
    """Loss-augmented potentials: + scale on every unary state that differs from y [*B, n]."""
    y = pot.check_labels(y)
    wrong = 1.0 - torch.nn.functional.one_hot(y, pot.num_states).to(pot.dtype)
    return Potentials(pot.unary + scale * wrong, pot.pairwise, pot.graph)


def structured_hinge(pot: Potentials, y: torch.Tensor, max_fn: MaxFn = map_value, scale: float = 1.0) -> torch.Tensor:
    """M3N hinge with Hamming margin rescaling [*B]:
    max_y' [score(y') + scale * Hamming(y, y')] - score(y) >= 0.

    ``max_fn`` computes the loss-augmented max: ``map_value`` (exact, trees), or an upper bound
    such as the smoothed LP value on loopy graphs (the loss stays an upper bound on the hinge).
    """
    return max_fn(hamming_augment(pot, y, scale)) - pot.score(y)


def crf_nll(pot: Potentials, y: torch.Tensor) -> torch.Tensor:
    """Negative conditional log-likelihood [*B]: log Z - score(y) (exact on trees)."""
    return tree_logz(pot) - pot.score(y)
