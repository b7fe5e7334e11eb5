"""Inputs: per-node and per-edge features of grid images (inputs that are not a flat feature matrix), and the
per-feature standardisation of a feature matrix (the datamodules' and the tree-CRF conditionals')."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GridInputs", "Standardizer"]


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


#: ``Standardizer.fit`` computes its float64 statistics over blocks of columns of at most this many entries: at
#: bookmarks' shape (55,349 x 2,150) the whole float64 copy and its temporaries peaked at 2.8 GB beside x
STATS_BLOCK_ELEMENTS = 2**24


@dataclass
class Standardizer:
    """Per-feature affine standardisation ``(x - mean) / std`` fitted on training data only.

    mean, std: [D], in the dtype of the standardised features. Features constant on the training set
    (std < eps) get std = 1, so they map to 0 instead of blowing up. Missing values (NaN) are ignored by
    ``fit`` and imputed with the training mean by ``transform`` / ``impute`` (0 after standardisation).
    """

    mean: torch.Tensor
    std: torch.Tensor

    @classmethod
    def fit(cls, x: torch.Tensor, eps: float = 1e-8, dtype: torch.dtype = torch.float32) -> Standardizer:
        """Statistics of x [N, D] (population std, NaN ignored), computed in float64, kept in ``dtype``."""
        if x.dim() != 2 or x.shape[0] == 0:
            raise ValueError(f"Standardizer.fit needs x of shape [N >= 1, D], got {tuple(x.shape)}")
        width = max(1, STATS_BLOCK_ELEMENTS // x.shape[0])
        means, variances = [], []
        for block in x.split(width, dim=1):  # float64 temporaries of at most STATS_BLOCK_ELEMENTS entries
            block = block.to(torch.float64)
            means.append(torch.nan_to_num(block.nanmean(0), nan=0.0))
            variances.append(torch.nan_to_num((block - means[-1]).square().nanmean(0), nan=1.0))
        mean, std = torch.cat(means), torch.cat(variances).sqrt()
        std = torch.where(std < eps, torch.ones_like(std), std)
        return cls(mean.to(dtype), std.to(dtype))

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """Standardised x [N, D] (in the statistics' dtype); NaN -> 0 (the training mean)."""
        out = x.to(self.mean.dtype, copy=True)  # one [N, D] result, standardised in place
        return out.sub_(self.mean).div_(self.std).nan_to_num_(nan=0.0)

    def impute(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, D] with NaN replaced by the training mean, otherwise unchanged."""
        return torch.where(torch.isnan(x), self.mean.to(x.dtype), x)
