"""Mulan multi-label datasets by name: ``load_mulan("emotions")``.

A dataset of the Mulan collection (``mulan_datasets()``) is read from the verified download cache
(``download.fetch_mulan``: ``$STRUCTTORCH_DATA/mulan/<name>/``, filled on first use); ``root=<dir>``
reads a local copy ``<dir>/<name>/<name>-train.arff``, ``<name>-test.arff``, ``<name>.xml`` instead.

Labels are the binary attributes named in the Mulan label XML (``<labels xmlns=...><label
name="..."/>...``), or, when there is no XML, the last ``label_attributes`` attributes. Labels keep the
order in which they appear among the ARFF attributes. Features are the other numeric
attributes; a nominal attribute whose declared values are all numbers (e.g. the ``{0,1}`` word
indicators of medical / enron / bibtex) is a numeric feature with that value. Other non-label
attributes (string IDs, categorical nominals) are dropped with a warning. Missing feature
values stay NaN (with a warning); ``MultilabelDataModule`` imputes them with the training mean.
"""

from __future__ import annotations

import os
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np
import torch

from ..folds import train_val_indices
from ..graph import check_int
from .arff import ArffData, load_arff
from .download import fetch_mulan, mulan_datasets, mulan_files

__all__ = ["MULAN_URL", "MulanData", "arff_to_multilabel", "load_mulan", "load_mulan_splits",
           "most_frequent_labels", "mulan_paths", "read_mulan_labels"]

MULAN_URL = "http://mulan.sourceforge.net/datasets-mlc.html"
SPLITS = ("train", "test", "all")


@dataclass
class MulanData:
    """Both splits of a Mulan dataset.

    x_train [N_train, D] float32, y_train [N_train, L] int64 in {0, 1}; same for test.
    test_from_file: False when the dataset had no test file and test was split off with a seed.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    feature_names: list[str]
    label_names: list[str]
    test_from_file: bool = True

    @property
    def num_features(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def num_labels(self) -> int:
        return int(self.y_train.shape[1])


def mulan_paths(root: str | os.PathLike, name: str) -> dict[str, str]:
    """The expected file paths: keys ``train``, ``test``, ``xml``, ``full`` (a single ``<name>.arff``)."""
    d = os.path.join(os.fspath(root), name)
    return {"train": os.path.join(d, f"{name}-train.arff"), "test": os.path.join(d, f"{name}-test.arff"),
            "xml": os.path.join(d, f"{name}.xml"), "full": os.path.join(d, f"{name}.arff")}


def read_mulan_labels(xml_path: str | os.PathLike) -> list[str]:
    """Label names from a Mulan label XML (any namespace; nested hierarchical labels included)."""
    xml_path = os.fspath(xml_path)
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError as err:
        line = err.position[0] if err.position else "?"
        raise ValueError(f"{xml_path}, line {line}: malformed Mulan label XML: {err}") from None
    names = [el.get("name") for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "label"]
    if not names:
        raise ValueError(f"{xml_path}: no <label name=\"...\"/> elements found in the Mulan label XML")
    if any(n is None for n in names):
        raise ValueError(f"{xml_path}: a <label> element has no name attribute")
    return [str(n) for n in names]


def load_mulan(name: str, split: str = "train", root: str | os.PathLike | None = None, url: str | None = None,
               max_labels: int | None = None, label_attributes: int | None = None, test_fraction: float = 0.3,
               seed: int = 0, progress: bool = True) -> tuple[torch.Tensor, torch.Tensor, list[str], list[str]]:
    """Load one split of a Mulan dataset by name, downloading it into the cache on first use.

    Returns (features FloatTensor [N, D], labels LongTensor [N, L] in {0, 1}, feature_names [D],
    label_names [L]). ``split`` is ``"train"``, ``"test"`` or ``"all"`` (train then test).

    name: a dataset of the Mulan collection (``mulan_datasets()``), or of your own with ``root``.
    root: a local copy ``<root>/<name>/<name>-train.arff, -test.arff, .xml`` used as is; None (default)
        reads the cache ``$STRUCTTORCH_DATA/mulan/<name>`` (default ``~/.cache/structtorch``), filling
        it from ``url`` (default: the Mulan GitHub repository at a pinned commit) with checksums.
    max_labels: keep only the ``max_labels`` labels most frequent in the training data (ties: lower
        label index first; label order preserved), e.g. 10 for medical as in CRANK.
    label_attributes: for data without ``<name>.xml``, the labels are the last ``label_attributes``
        attributes of the ARFF file.
    A dataset without a test file has ``test_fraction`` of its rows split off as the test set
    (random permutation seeded by ``seed``). ``progress``: download progress bar on stderr.
    Raises FileNotFoundError (with the expected layout) if a local copy is absent, ValueError for an
    unknown dataset name, ``DownloadError`` if a download fails its checks.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    data = load_mulan_splits(name, root=root, url=url, max_labels=max_labels, label_attributes=label_attributes,
                             test_fraction=test_fraction, seed=seed, progress=progress)
    if split == "train":
        x, y = data.x_train, data.y_train
    elif split == "test":
        x, y = data.x_test, data.y_test
    else:
        x, y = torch.cat([data.x_train, data.x_test]), torch.cat([data.y_train, data.y_test])
    return x, y, data.feature_names, data.label_names


def load_mulan_splits(name: str, root: str | os.PathLike | None = None, url: str | None = None,
                      max_labels: int | None = None, label_attributes: int | None = None,
                      test_fraction: float = 0.3, seed: int = 0, progress: bool = True) -> MulanData:
    """Both splits of a Mulan dataset (arguments as ``load_mulan``), each file parsed once."""
    paths = _resolve_paths(name, root, url, progress)
    train_path = _train_path(paths, root, name)
    xml = paths.get("xml")
    label_names = read_mulan_labels(xml) if xml and os.path.isfile(xml) else None
    if label_names is None and label_attributes is None:
        where = os.path.abspath(xml) if xml else f"{name}.xml (the Mulan catalog has none)"
        raise ValueError(f"no Mulan label file {where}: pass label_attributes=L to take the last L attributes "
                         f"of the ARFF file as the labels")
    if label_names is not None and label_attributes is not None and label_attributes != len(label_names):
        raise ValueError(f"label_attributes={label_attributes} disagrees with the {len(label_names)} labels "
                         f"listed in {xml}")
    x_tr, y_tr, feats, labels = arff_to_multilabel(load_arff(train_path), label_names, label_attributes)
    test = paths.get("test")
    if test and os.path.isfile(test):
        x_te, y_te, feats_te, labels_te = arff_to_multilabel(load_arff(test), label_names, label_attributes)
        if feats_te != feats or labels_te != labels:
            raise ValueError(f"{test} and {train_path} declare different features or labels")
        from_file = True
    else:
        train_idx, test_idx = _split_indices(len(x_tr), test_fraction, seed)
        x_tr, y_tr, x_te, y_te = x_tr[train_idx], y_tr[train_idx], x_tr[test_idx], y_tr[test_idx]
        from_file = False
    if max_labels is not None:
        keep = most_frequent_labels(y_tr, max_labels)
        y_tr, y_te, labels = y_tr[:, keep], y_te[:, keep], [labels[j] for j in keep]
    return MulanData(torch.from_numpy(x_tr), torch.from_numpy(y_tr), torch.from_numpy(x_te),
                     torch.from_numpy(y_te), feats, labels, from_file)


def most_frequent_labels(y: np.ndarray, max_labels: int) -> list[int]:
    """Indices of the ``max_labels`` most frequent labels of y [N, L] (ties: lower index), ascending."""
    L = y.shape[1]
    check_int(max_labels, "max_labels", 1, L, f"None or an int in [1, {L}] (the dataset has {L} labels)")
    by_frequency = np.argsort(-y.sum(0), kind="stable")
    return sorted(int(j) for j in by_frequency[:max_labels])


def arff_to_multilabel(data: ArffData, label_names: list[str] | None = None, label_attributes: int | None = None
                       ) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """Split parsed ARFF columns into features float32 [N, D] and binary labels int64 [N, L].

    Labels: the attributes named in ``label_names``, else the last ``label_attributes`` attributes.
    Returns (x, y, feature_names, label_names), labels in ARFF attribute order.
    """
    if data.num_rows == 0:
        raise ValueError(f"{data.path}: the ARFF file has no data rows")
    label_cols = _label_columns(data, label_names, label_attributes)
    y = np.stack([_label_column(data, j) for j in label_cols], 1).astype(np.int64)
    feature_cols, dropped = _feature_columns(data, set(label_cols))
    if dropped:
        warnings.warn(f"{data.path}: dropping {len(dropped)} non-numeric, non-label attribute(s) "
                      f"{dropped} (string or categorical nominal)", UserWarning, stacklevel=3)
    if not feature_cols:
        raise ValueError(f"{data.path}: no numeric feature attributes left besides the labels")
    x = np.stack([_feature_column(data, j) for j in feature_cols], 1).astype(np.float32)
    if np.isnan(x).any():
        warnings.warn(f"{data.path}: {int(np.isnan(x).sum())} missing feature value(s) ('?') kept as "
                      f"NaN", UserWarning, stacklevel=3)
    names = data.names
    return x, y, [names[j] for j in feature_cols], [names[j] for j in label_cols]


# ---------------------------------------------------------------------- helpers
def _resolve_paths(name: str, root: str | os.PathLike | None, url: str | None, progress: bool) -> dict[str, str]:
    """File paths by role (``train`` / ``test`` / ``xml`` / ``full``): a local copy under ``root``, else the
    verified cache (downloading what is missing)."""
    if root is None:
        directory = fetch_mulan(name, url=url, progress=progress)
        return {role: os.fspath(directory / f.file) for role, f in mulan_files(name).items()}
    root = os.path.expanduser(os.fspath(root))
    paths = mulan_paths(root, name)
    if not any(os.path.isfile(paths[k]) for k in ("train", "full")) and name in mulan_datasets():
        try:  # the Mulan repository's own file names, e.g. <root>/tmc2007/tmc2007-500-train.arff
            files = mulan_files(name)
        except ValueError:
            return paths
        alt = {role: os.path.join(root, name, f.file) for role, f in files.items()}
        if any(os.path.isfile(alt[k]) for k in ("train", "full") if k in alt):
            return alt
    return paths


def _train_path(paths: dict[str, str], root: str | os.PathLike | None, name: str) -> str:
    """The training (or single) ARFF file; FileNotFoundError with the expected layout if absent."""
    for key in ("train", "full"):
        if key in paths and os.path.isfile(paths[key]):
            return paths[key]
    missing = os.path.abspath(paths.get("train") or paths["full"])
    by_name = " (or leave root unset to download it by name)" if name in mulan_datasets() else ""
    raise FileNotFoundError(
        f"Mulan dataset {name!r} not found: {missing} does not exist. "
        f"Download it from {MULAN_URL} and unpack it as <root>/<name>/<name>-train.arff, "
        f"<root>/<name>/<name>-test.arff, <root>/<name>/<name>.xml (here root={root!r}, "
        f"name={name!r}); a single <name>.arff without a test file is also accepted{by_name}.")


def _split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of range(n) into sorted train and test indices, at least one each (``train_val_indices``)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    if n < 2:
        raise ValueError(f"cannot split {n} example(s) into train and test")
    train, test = train_val_indices(n, test_fraction, seed)
    return train.numpy(), test.numpy()


def _label_columns(data: ArffData, label_names: list[str] | None, label_attributes: int | None) -> list[int]:
    names = data.names
    if label_names is not None:
        missing = [n for n in label_names if n not in names]
        if missing:
            raise ValueError(f"{data.path}: label(s) {missing} from the Mulan XML are not attributes "
                             f"of the ARFF file")
        wanted = set(label_names)
        return [j for j, n in enumerate(names) if n in wanted]
    L = label_attributes
    check_int(L, "label_attributes", 1, len(names) - 1,
              f"an int in [1, {len(names) - 1}] (the file has {len(names)} attributes)")
    return list(range(len(names) - L, len(names)))


def _label_column(data: ArffData, j: int) -> np.ndarray:
    """The {0, 1} values [N] of label attribute j; ValueError naming the line of a bad value."""
    attr = data.attributes[j]
    if attr.kind == "nominal" and attr.is_binary_nominal:
        raw = data.nominal_value(j)
        y = np.where(raw == "1", 1.0, np.where(raw == "0", 0.0, np.nan))
    elif attr.kind == "numeric":
        y = data.values[:, j]
    else:
        decl = "{" + ",".join(attr.values) + "}" if attr.kind == "nominal" else attr.kind
        raise ValueError(f"{data.path}: label attribute {attr.name!r} must be binary {{0,1}}, "
                         f"it is declared {decl}")
    bad = np.flatnonzero(~np.isin(y, (0.0, 1.0)))
    if bad.size:
        i = int(bad[0])
        v = "missing ('?')" if np.isnan(y[i]) else repr(float(y[i]))
        raise ValueError(f"{data.path}, line {data.lines[i]}: label {attr.name!r} has value {v}; "
                         f"labels must be 0 or 1")
    return y


def _feature_columns(data: ArffData, label_cols: set[int]) -> tuple[list[int], list[str]]:
    keep, dropped = [], []
    for j, attr in enumerate(data.attributes):
        if j in label_cols:
            continue
        if attr.kind == "numeric" or attr.is_numeric_nominal:
            keep.append(j)
        else:
            dropped.append(attr.name)
    return keep, dropped


def _feature_column(data: ArffData, j: int) -> np.ndarray:
    attr = data.attributes[j]
    col = data.values[:, j]
    if attr.kind == "numeric":
        return col
    table = np.array([*(float(v) for v in attr.values), np.nan])
    return table[np.where(np.isnan(col), len(attr.values), col).astype(np.int64)]
