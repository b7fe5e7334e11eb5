"""LightningDataModules for multi-label data: Mulan ARFF datasets, the synthetic CRANK data and the
synthetic tree-CRF data of Bradley & Guestrin (2010).

Batches are tuples ``(x [B, D] float32, y [B, L] int64, index [B] int64)`` from a ``TensorDataset``;
``index`` is the example's position in its split (learners use it to warm-start per-example state,
e.g. the messages of ``smoothed_lp``).
``num_features`` / ``num_labels`` (and ``train_tensors``) can be read before any Trainer runs:
they call ``setup()`` on first access, which is idempotent and independent of ``stage``.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from ..folds import kfold_indices, row_subset, train_val_indices
from ..graph import check_int
from ..inputs import Standardizer
from .download import fetch_mulan, mulan_datasets, mulan_files
from .mulan import load_mulan_splits
from .synthetic import crank_synthetic
from .tree_crf_synthetic import tree_crf_synthetic

__all__ = ["EpochShuffle", "MultilabelDataModule", "Shard", "SyntheticDataModule", "TreeCRFSyntheticDataModule",
           "indexed_dataset"]


def indexed_dataset(x: torch.Tensor, y: torch.Tensor) -> TensorDataset:
    """Examples ``(x [N, ...], y [N, L] long, index [N])``: each one carries its position in the split."""
    return TensorDataset(x, y.long(), torch.arange(len(x)))


class EpochShuffle(DistributedSampler):
    """Training order: a random permutation per epoch drawn from (seed, epoch) alone, so a run
    resumed from a checkpoint sees exactly the batches of an uninterrupted one (Lightning calls
    ``set_epoch``).

    Under data parallelism (``num_replicas`` processes, per-process ``batch_size``), step k of
    every rank takes its slice of the single-process global batch k, so the averaged gradient
    equals the one-process gradient of the same global batch. Being a ``DistributedSampler``,
    Lightning leaves it in place instead of wrapping (and reshuffling) it.
    """

    def __init__(self, n: int, seed: int, batch_size: int = 1, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(range(n), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.n, self.batch_size = n, batch_size

    def _blocks(self) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        perm = torch.randperm(self.n, generator=gen)
        W = self.num_replicas
        if W == 1:
            return [perm]
        blocks = list(perm.split(self.batch_size * W))
        if len(blocks[-1]) < W:  # every rank needs a batch: pad the last global batch (as DistributedSampler)
            blocks[-1] = torch.cat([blocks[-1], perm[: W - len(blocks[-1])]])
        return [torch.tensor_split(b, W)[self.rank] for b in blocks]

    def __iter__(self):
        return iter(torch.cat(self._blocks()).tolist())

    def __len__(self) -> int:
        return sum(len(b) for b in self._blocks())


class Shard(DistributedSampler):
    """Evaluation order under data parallelism: rank r takes examples r, r + W, ... with no padding,
    so metrics summed across ranks count every example exactly once."""

    def __init__(self, n: int, num_replicas: int, rank: int) -> None:
        super().__init__(range(n), num_replicas=num_replicas, rank=rank, shuffle=False)
        self.n = n

    def __iter__(self):
        return iter(range(self.rank, self.n, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.num_replicas))


class EpochLoaders(L.LightningDataModule):
    """The loaders every datamodule shares: shuffled per epoch (``EpochShuffle``) for training, sharded across
    processes for evaluation. Subclasses hold ``data_train`` / ``data_val`` / ``data_test`` datasets, ``seed``,
    ``batch_size``, ``num_workers``, a ``_ready()`` that sets them up, and optionally ``collate_fn``."""

    collate_fn = None

    def _ready(self) -> None:
        if self.data_train is None:
            self.setup()

    def _loader(self, data: Dataset, shuffle: bool) -> DataLoader:
        trainer = getattr(self, "trainer", None)
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if shuffle:
            sampler = EpochShuffle(len(data), self.seed, self.batch_size, world, rank)
        else:
            sampler = Shard(len(data), world, rank) if world > 1 else None
        return DataLoader(data, batch_size=self.batch_size, sampler=sampler,
                          collate_fn=self.collate_fn, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        self._ready()
        return self._loader(self.data_train, shuffle=True)

    def val_dataloader(self) -> DataLoader | list:
        """The validation loader; an empty list (Lightning skips validation) when val_fraction == 0."""
        self._ready()
        return self._loader(self.data_val, shuffle=False) if len(self.data_val) else []

    def test_dataloader(self) -> DataLoader:
        self._ready()
        return self._loader(self.data_test, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()


class _TensorDataModule(EpochLoaders):
    """Shared logic: split train/val (seeded), optional k-fold, standardise, build loaders.

    Subclasses implement ``_load() -> (x_train, y_train, x_test, y_test, feature_names, label_names)``.
    """

    def __init__(self, batch_size: int, val_fraction: float, seed: int, num_folds: int | None, fold: int,
                 num_workers: int, standardize: bool, fold_pool: str = "train+test") -> None:
        super().__init__()
        if fold_pool not in ("train+test", "train"):
            raise ValueError(f"fold_pool must be 'train+test' or 'train', got {fold_pool!r}")
        check_int(batch_size, "batch_size", 1)
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must lie in [0, 1), got {val_fraction}")
        if num_folds is not None:
            check_int(num_folds, "num_folds", 2, expected="None or an int >= 2")
            check_int(fold, "fold", 0, num_folds - 1, f"an int in [0, num_folds={num_folds})")
        self.batch_size, self.val_fraction, self.seed = batch_size, val_fraction, seed
        self.num_folds, self.fold, self.fold_pool = num_folds, fold, fold_pool
        self.num_workers, self.standardize = num_workers, standardize
        self.standardizer: Standardizer | None = None
        self.feature_names: list[str] = []
        self.label_names: list[str] = []
        self.data_train: TensorDataset | None = None
        self.data_val: TensorDataset | None = None
        self.data_test: TensorDataset | None = None

    def _load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[str], list[str]]:
        raise NotImplementedError

    # ------------------------------------------------------------------ setup
    def setup(self, stage: str | None = None) -> None:
        """Load, split and standardise once (idempotent; ``stage`` is ignored)."""
        if self.data_train is not None:
            return
        x_tr, y_tr, x_te, y_te, self.feature_names, self.label_names = self._load()
        if self.num_folds is not None:  # the test file stays out of the folds with fold_pool="train"
            pooled = self.fold_pool == "train+test"
            x_all, y_all = (torch.cat([x_tr, x_te]), torch.cat([y_tr, y_te])) if pooled else (x_tr, y_tr)
            rest, test = kfold_indices(len(x_all), self.num_folds, self.fold, self.seed)
            x_tr, y_tr, x_te, y_te = x_all[rest], y_all[rest], x_all[test], y_all[test]
        tr, va = train_val_indices(len(x_tr), self.val_fraction, self.seed)
        x_va, y_va, x_tr, y_tr = x_tr[va], y_tr[va], x_tr[tr], y_tr[tr]
        self.standardizer = Standardizer.fit(x_tr)
        prep = self.standardizer.transform if self.standardize else self.standardizer.impute
        self.data_train = indexed_dataset(prep(x_tr), y_tr)
        self.data_val = indexed_dataset(prep(x_va), y_va)
        self.data_test = indexed_dataset(prep(x_te), y_te)

    @property
    def num_features(self) -> int:
        """D (runs ``setup()`` if needed)."""
        self._ready()
        return int(self.data_train.tensors[0].shape[1])

    @property
    def num_labels(self) -> int:
        """L (runs ``setup()`` if needed)."""
        self._ready()
        return int(self.data_train.tensors[1].shape[1])

    @property
    def train_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole (preprocessed) training set: x [N, D] float32, y [N, L] int64."""
        self._ready()
        return self.data_train.tensors[:2]

    @property
    def val_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._ready()
        return self.data_val.tensors[:2]

    @property
    def test_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._ready()
        return self.data_test.tensors[:2]

    # ------------------------------------------------------------------ loaders

class MultilabelDataModule(_TensorDataModule):
    """A Mulan multi-label dataset by name (``load_mulan_splits``): downloaded into the verified cache
    ``$STRUCTTORCH_DATA/mulan/<name>`` on first use (``url`` overrides the source), or read from a local
    copy ``<root>/<name>/<name>-train.arff``, ``-test.arff``, ``.xml`` when ``root`` is given.

    Default protocol: train/val split of the train file (``val_fraction``, seeded), test = the
    official test file. With ``num_folds`` (e.g. 5 for RTA's protocol) train and test files are
    pooled and fold ``fold`` of a seeded k-fold partition is the test set; validation is then
    split from the remaining folds. ``fold_pool="train"`` folds the training file alone (cross-validation
    that never sees the test file: the held-out fold is the "test" set). Standardisation statistics come
    from the final training part only. ``test_fraction`` splits off a test set (seeded) for datasets without
    a test file; ``label_attributes`` names the labels as the last L attributes for datasets without ``<name>.xml``;
    ``max_labels`` keeps the most frequent labels of the training file (e.g. 10 for medical, as in CRANK);
    ``max_rows`` keeps a seeded random subset of that many training-file rows, in file order (learning curves,
    ``scripts/bench_scale.py``).
    ValueError (raised here, before any loading) if ``name`` is missing or not a Mulan dataset.
    """

    def __init__(self, name: str | None = None, root: str | None = None, url: str | None = None,
                 batch_size: int = 64, val_fraction: float = 0.1, seed: int = 0, num_folds: int | None = None,
                 fold: int = 0, num_workers: int = 0, standardize: bool = True, test_fraction: float = 0.3,
                 label_attributes: int | None = None, max_labels: int | None = None, fold_pool: str = "train+test",
                 max_rows: int | None = None) -> None:
        super().__init__(batch_size, val_fraction, seed, num_folds, fold, num_workers, standardize, fold_pool)
        if name is None or name == "???":
            raise ValueError(f"data=mulan needs data.name=<dataset>, one of: {', '.join(mulan_datasets())} "
                             f"(or a dataset of your own under data.root=<dir>)")
        if root is None:
            mulan_files(name)  # an unknown or undownloadable name fails now, with suggestions
        self.save_hyperparameters(logger=False)  # train.py logs them apart (data.seed != model.seed)
        self.name, self.root, self.url = name, root, url
        self.test_fraction, self.label_attributes, self.max_labels = test_fraction, label_attributes, max_labels
        self.max_rows = None if max_rows is None else check_int(max_rows, "data.max_rows", 1)

    def prepare_data(self) -> None:
        """Download the dataset into the cache if needed (Lightning runs this on one process per node)."""
        if self.root is None:
            fetch_mulan(self.name, url=self.url)

    def _load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[str], list[str]]:
        d = load_mulan_splits(self.name, root=self.root, url=self.url, max_labels=self.max_labels,
                              label_attributes=self.label_attributes, test_fraction=self.test_fraction,
                              seed=self.seed)
        x, y = d.x_train, d.y_train
        if self.max_rows is not None and self.max_rows < len(x):
            keep = row_subset(len(x), self.max_rows, self.seed)
            x, y = x[keep], y[keep]
        return x, y, d.x_test, d.y_test, d.feature_names, d.label_names


class SyntheticDataModule(_TensorDataModule):
    """The synthetic CRANK data (``crank_synthetic``): the project's built-in dataset, no files needed.

    ``seed`` draws the model (tree + weights) and the data; the train/val split and shuffling use it
    too. After ``setup()``, ``dataset`` holds the full ``CrankSynthetic`` (true tree, weights).
    """

    def __init__(self, num_train: int = 1000, num_test: int = 1000, num_labels: int = 10,
                 num_features: int = 4, batch_size: int = 64, val_fraction: float = 0.1, seed: int = 0,
                 num_folds: int | None = None, fold: int = 0, num_workers: int = 0, standardize: bool = False,
                 pairwise_scale: float | None = None, pairwise_mean: float = 0.0) -> None:
        super().__init__(batch_size, val_fraction, seed, num_folds, fold, num_workers, standardize)
        self.save_hyperparameters(logger=False)  # train.py logs them apart (data.seed != model.seed)
        self.num_train, self.num_test = num_train, num_test
        self._num_labels_arg, self._num_features_arg = num_labels, num_features
        self.pairwise_scale, self.pairwise_mean = pairwise_scale, pairwise_mean
        self.dataset = None

    def _load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[str], list[str]]:
        d = crank_synthetic(self.num_train, self.num_test, self._num_labels_arg, self._num_features_arg,
                            seed=self.seed, pairwise_scale=self.pairwise_scale, pairwise_mean=self.pairwise_mean)
        self.dataset = d
        feats = [f"x{i}" for i in range(d.num_features)]
        return d.x_train, d.y_train, d.x_test, d.y_test, feats, [f"y{i}" for i in range(d.num_labels)]


class TreeCRFSyntheticDataModule(_TensorDataModule):
    """The synthetic tree-CRF data of Bradley & Guestrin (ICML 2010) (``tree_crf_synthetic``): binary inputs
    x0.. (one per label) and binary labels y0.., no files needed.

    ``seed`` draws the model (tree + factors) and the data; the train/val split and shuffling use it too.
    After ``setup()``, ``dataset`` holds the full ``TreeCRFSynthetic`` (true tree, factor tables).
    """

    def __init__(self, num_train: int = 500, num_test: int = 1000, num_labels: int = 40, structure: str = "tree",
                 factors: str = "associative", strengths: tuple[float, float, float] | list[float] = (4.0, 2.0, 1.0),
                 alternating: bool = True, cross: bool = True, cross_strength: float | None = None,
                 joint: str = "intractable", batch_size: int = 64, val_fraction: float = 0.1, seed: int = 0,
                 num_folds: int | None = None, fold: int = 0, num_workers: int = 0, standardize: bool = False) -> None:
        super().__init__(batch_size, val_fraction, seed, num_folds, fold, num_workers, standardize)
        self.save_hyperparameters(logger=False)  # train.py logs them apart (data.seed != model.seed)
        self.options = dict(num_train=num_train, num_test=num_test, num_labels=num_labels, structure=structure,
                            factors=factors, strengths=tuple(strengths), alternating=alternating, cross=cross,
                            cross_strength=cross_strength, joint=joint)
        self.dataset = None

    def _load(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[str], list[str]]:
        d = tree_crf_synthetic(**self.options, seed=self.seed)
        self.dataset = d
        feats = [f"x{i}" for i in range(d.num_features)]
        return d.x_train, d.y_train, d.x_test, d.y_test, feats, [f"y{i}" for i in range(d.num_labels)]
