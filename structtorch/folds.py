"""Seeded splits of range(n) into training / validation sets and k folds (core: torch only).

``structtorch.data`` re-exports them; the engine and the estimation layer take their folds from here.
"""

from __future__ import annotations

import torch

from .graph import check_int

__all__ = ["fold_assignment", "kfold_indices", "row_subset", "rows_at_most", "train_val_indices"]


def train_val_indices(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded random split of range(n): (train_idx, val_idx), each sorted, val of size
    round(val_fraction * n) (at least 1 when val_fraction > 0, and leaving at least 1 for training)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in [0, 1), got {val_fraction}")
    if n < 1:
        raise ValueError("cannot split an empty training set into train and validation")
    n_val = 0 if val_fraction == 0 else min(n - 1, max(1, round(val_fraction * n)))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[n_val:].sort().values, perm[:n_val].sort().values


def row_subset(n: int, size: int, seed: int) -> torch.Tensor:
    """A seeded random subset of ``size`` of range(n) (all of it when size >= n), sorted: [min(size, n)] long."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:size].sort().values


def rows_at_most(x: torch.Tensor, y: torch.Tensor, size: int | None, option: str
                 ) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(x, y, note): at most ``size`` of the rows of x [N, D] and y [N, n] (``row_subset``, seed 0; None: all) and
    a note for progress lines naming ``option``, the setting that chose ``size`` ("" when all rows are kept)."""
    if size is None or len(x) <= size:
        return x, y, ""
    keep = row_subset(len(x), size, seed=0)
    return x[keep.to(x.device)], y[keep.to(y.device)], f" from {size} of the {len(x)} rows ({option})"


def kfold_indices(n: int, num_folds: int, fold: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold ``fold`` of a seeded k-fold partition of range(n): (rest_idx, fold_idx), each sorted.

    The k folds are disjoint, cover range(n), and differ in size by at most one.
    """
    num_folds = check_int(num_folds, "num_folds", 2, n, f"an int in [2, n={n}]")
    fold = check_int(fold, "fold", 0, num_folds - 1, f"an int in [0, num_folds={num_folds})")
    in_fold = fold_assignment(n, num_folds, seed) == fold
    return in_fold.logical_not().nonzero().squeeze(1), in_fold.nonzero().squeeze(1)


def fold_assignment(n: int, num_folds: int, seed: int) -> torch.Tensor:
    """The fold [n] (long, in [0, num_folds)) of each of n examples: a seeded balanced partition."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return torch.empty(n, dtype=torch.long).index_put_((perm,), torch.arange(n) % num_folds)
