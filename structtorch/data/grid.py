"""LightningDataModules for per-pixel labels on grid graphs (image structured prediction).

Batches are ``(GridInputs(unary [B, n, Du], pairwise [B, E, Dp]), y [B, n] int64, index [B] int64)``; n = h * w
pixels, E the edges of ``Graph.grid(h, w)``; ``index`` is the image's position in its split (per-example
state such as Domke's messages). ``learner_inputs`` tells ``train.build_learner`` the grid sizes.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from ..folds import train_val_indices
from ..graph import check_float, check_int
from ..inputs import GridInputs
from .datamodule import EpochLoaders
from .denoising import DenoisingImages, denoising_images

__all__ = ["DenoisingDataModule", "GridDataModule", "GridDataset"]


class GridDataset(Dataset):
    """Images i -> (unary [n, Du], pairwise [E, Dp], y [n], i); ``collate`` stacks them into a grid batch."""

    def __init__(self, unary: torch.Tensor, pairwise: torch.Tensor, y: torch.Tensor) -> None:
        self.inputs, self.y = GridInputs(unary.float(), pairwise.float()), y.long()
        if self.y.shape != self.inputs.unary.shape[:2]:
            raise ValueError(f"labels must be [N, n] = {list(self.inputs.unary.shape[:2])}, got {list(self.y.shape)}")

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.inputs.unary[i], self.inputs.pairwise[i], self.y[i], i

    @staticmethod
    def collate(items: list) -> tuple[GridInputs, torch.Tensor, torch.Tensor]:
        u, p, y, i = zip(*items)
        return GridInputs(torch.stack(u), torch.stack(p)), torch.stack(y), torch.tensor(i, dtype=torch.long)


class GridDataModule(EpochLoaders):
    """Per-pixel K-state labels on an h x w 4-connected grid; subclasses implement ``_load``.

    ``_load() -> (train: DenoisingImages-like, test)`` with fields unary, pairwise, y, height, width.
    A seeded ``val_fraction`` of the training images is held out for validation (default none).
    """

    collate_fn = staticmethod(GridDataset.collate)
    is_grid = True

    def __init__(self, batch_size: int = 16, val_fraction: float = 0.0, seed: int = 0, num_workers: int = 0,
                 num_states: int = 2) -> None:
        super().__init__()
        check_int(batch_size, "batch_size", 1)
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must lie in [0, 1), got {val_fraction}")
        self.batch_size, self.val_fraction, self.seed = batch_size, val_fraction, seed
        self.num_workers, self.num_states = num_workers, num_states
        self.height = self.width = 0
        self.label_names: list[str] = []  # pixels are not named (n may be 10^4)
        self.data_train: GridDataset | None = None
        self.data_val: GridDataset | None = None
        self.data_test: GridDataset | None = None

    def _load(self) -> tuple[DenoisingImages, DenoisingImages]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        """Load and split once (idempotent; ``stage`` is ignored)."""
        if self.data_train is not None:
            return
        train, test = self._load()
        self.height, self.width = train.height, train.width
        tr, va = train_val_indices(len(train.y), self.val_fraction, self.seed)
        self.data_train = GridDataset(train.unary[tr], train.pairwise[tr], train.y[tr])
        self.data_val = GridDataset(train.unary[va], train.pairwise[va], train.y[va])
        self.data_test = GridDataset(test.unary, test.pairwise, test.y)

    @property
    def num_features(self) -> int:
        """Du, the unary features per pixel."""
        self._ready()
        return int(self.data_train.inputs.unary.shape[-1])

    @property
    def num_labels(self) -> int:
        """n = h * w, the pixels (one label each)."""
        self._ready()
        return int(self.data_train.y.shape[1])

    @property
    def learner_inputs(self) -> dict[str, int]:
        """What a grid learner needs beyond (num_features, num_labels): grid size, Dp and K."""
        self._ready()
        return {"height": self.height, "width": self.width, "num_states": self.num_states,
                "num_pair_features": int(self.data_train.inputs.pairwise.shape[-1])}

    @property
    def train_tensors(self) -> tuple[GridInputs, torch.Tensor]:
        """The whole training set: (GridInputs [N, ...], y [N, n])."""
        self._ready()
        return self.data_train.inputs, self.data_train.y

    @property
    def test_tensors(self) -> tuple[GridInputs, torch.Tensor]:
        self._ready()
        return self.data_test.inputs, self.data_test.y


class DenoisingDataModule(GridDataModule):
    """Domke's synthetic binary denoising images (``denoising_images``), no files needed: ``num_train`` /
    ``num_test`` images of ``height`` x ``width`` (paper: 16 / 16 of 100 x 100). ``seed`` draws the images
    (train first, then test, from one generator) and the train/val split."""

    def __init__(self, num_train: int = 16, num_test: int = 16, height: int = 100, width: int = 100,
                 blur: float = 10.0, batch_size: int = 16, val_fraction: float = 0.0, seed: int = 0,
                 num_workers: int = 0) -> None:
        super().__init__(batch_size, val_fraction, seed, num_workers, num_states=2)
        self.save_hyperparameters(logger=False)  # train.py logs them apart (data.seed != model.seed)
        self.options = dict(height=height, width=width, blur=blur)
        self.num_train, self.num_test = num_train, num_test
        check_float(blur, "data.blur", 0.0, expected="a number > 0 (the Gaussian's std in pixels)")
        for name, v in (("num_train", num_train), ("num_test", num_test), ("height", height), ("width", width)):
            check_int(v, f"data.{name}", 1)

    def _load(self) -> tuple[DenoisingImages, DenoisingImages]:
        gen = torch.Generator().manual_seed(self.seed)
        return denoising_images(self.num_train, **self.options, generator=gen), \
            denoising_images(self.num_test, **self.options, generator=gen)
