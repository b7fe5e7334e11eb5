"""Inputs that are not a flat feature matrix: per-node and per-edge features of grid images."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GridInputs"]


@dataclass
class GridInputs:
    """A batch of B images as local features on their grid graph (n nodes, E edges).

    unary: [B, n, Du] per-pixel features; pairwise: [B, E, Dp] per-edge features (edge order of the
    learner's graph, e.g. ``Graph.grid(h, w)``). Behaves like a batch tensor where the learners need
    one: ``len``, ``.to(device / dtype)``, indexing along B.
    """

    unary: torch.Tensor
    pairwise: torch.Tensor

    def __post_init__(self) -> None:
        u, p = self.unary, self.pairwise
        if not isinstance(u, torch.Tensor) or not isinstance(p, torch.Tensor):
            raise TypeError(f"GridInputs needs tensors, got {type(u).__name__} and {type(p).__name__}")
        if u.dim() != 3 or p.dim() != 3 or u.shape[0] != p.shape[0]:
            raise ValueError(f"GridInputs: unary must be [B, n, Du] and pairwise [B, E, Dp] with the same B, got "
                             f"{tuple(u.shape)} and {tuple(p.shape)}")
        if not (u.dtype.is_floating_point and p.dtype.is_floating_point):
            raise TypeError(f"GridInputs: features must be floating point, got {u.dtype} and {p.dtype}")

    def __len__(self) -> int:
        return int(self.unary.shape[0])

    def __getitem__(self, index) -> GridInputs:
        return GridInputs(self.unary[index], self.pairwise[index])

    def to(self, *args, **kwargs) -> GridInputs:
        """Both feature tensors ``.to(*args, **kwargs)`` (device and / or dtype)."""
        return GridInputs(self.unary.to(*args, **kwargs), self.pairwise.to(*args, **kwargs))

    @property
    def device(self) -> torch.device:
        return self.unary.device

    @property
    def dtype(self) -> torch.dtype:
        return self.unary.dtype
