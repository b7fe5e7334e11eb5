"""Mulan multi-label datasets by name: ``load_mulan("emotions")``.

A dataset of the Mulan collection (``mulan_datasets()``) is read from the verified download cache
(``download.fetch_mulan``: ``$STRUCTTORCH_DATA/mulan/<name>/``, filled on first use); ``root=<dir>``
reads a local copy ``<dir>/<name>/<name>-train.arff``, ``<name>-test.arff``, ``<name>.xml`` instead.

Labels are the binary attributes named in the Mulan label XML (``<labels xmlns=...><label
name="..."/>...``), or, when there is no XML, the last ``label_attributes`` attributes. Labels keep the
order in which they appear among the ARFF attributes. Every other attribute is a feature, encoded
from its ``@attribute`` declaration (so train and test files get the same columns):

- numeric (NUMERIC / REAL / INTEGER): one column, its value;
- nominal over ``{0,1}`` (the word indicators of medical, enron, tmc2007, ...): one column, its value;
- any other two-valued nominal ``{a,b}``: one 0/1 column ``name=b`` (1 for the second declared value,
  as Weka's NominalToBinary), e.g. genbase's ``PS00010 {YES,NO}`` -> ``PS00010=NO``;
- a nominal with k > 2 values: k one-hot columns ``name=value`` in declared order (flags' ``religion``);
- string attributes (IDs, raw text) are ignored, with one warning naming them.

Missing feature values (``?``) are imputed by ``load_mulan`` / ``load_mulan_splits`` from the training
split: numeric attributes with the training mean, nominal ones with the most frequent training value
(ties: the first declared value; a column without any training value gets 0 / its first value), with
one warning giving the counts. ``arff_to_multilabel`` alone, which sees one file, keeps them as NaN
(with a warning); ``Standardizer`` then imputes the training mean.
"""

from __future__ import annotations

import difflib
import os
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np
import torch

from ..folds import train_val_indices
from ..graph import check_int
from .arff import ArffAttribute, ArffData, load_arff
from .download import fetch_mulan, mulan_datasets, mulan_files

__all__ = ["MULAN_URL", "MulanData", "arff_to_multilabel", "load_mulan", "load_mulan_splits",
           "most_frequent_labels", "mulan_paths", "read_mulan_labels"]

MULAN_URL = "http://mulan.sourceforge.net/datasets-mlc.html"
SPLITS = ("train", "test", "all")
#: feature columns that ``_features`` converts from the parsed float64 values at a time: at bookmarks' shape
#: (87,856 rows, 2,150 features) converting them at once took 1.2 GB of float64 copy beside the values
FEATURE_BLOCK = 256


@dataclass
class MulanData:
    """Both splits of a Mulan dataset.

    x_train [N_train, D] float32 without NaN, y_train [N_train, L] int64 in {0, 1}; same for test.
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
    label_names [L]). ``split`` is ``"train"``, ``"test"`` or ``"all"`` (train then test). Nominal
    features are one-hot (D counts their columns, the same for every split), string attributes are
    ignored and missing values imputed from the training split, so x has no NaN (module docstring).

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
    label_names = _xml_label_names(name, paths.get("xml"), label_attributes)
    train, test, from_file = _train_and_test(train_path, paths.get("test"), test_fraction, seed)
    layout = _layout(train, label_names, label_attributes)
    _check_same_header(train, test)
    if layout.ignored:
        _warn_ignored(train.path, layout.ignored)
    _impute_missing(train, test, layout.features, from_file)
    x_tr, y_tr, feats, labels = _encode(train, layout)
    x_te, y_te, _, _ = _encode(test, layout)
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
    """Split the attributes of one parsed ARFF file into features float32 [N, D] and binary labels int64 [N, L].

    Labels: the attributes named in ``label_names``, else the last ``label_attributes`` attributes, in
    ARFF attribute order. Features are encoded as the module docstring says (D counts one-hot columns);
    string attributes are ignored and missing values are NaN, each with a warning.
    Returns (x, y, feature_names [D], label_names [L]).
    """
    layout = _layout(_with_rows(data), label_names, label_attributes)
    if layout.ignored:
        _warn_ignored(data.path, layout.ignored)
    missing = int(np.isnan(data.values)[:, layout.features].sum())
    if missing:
        warnings.warn(f"{data.path}: {missing} missing feature value(s) ('?') kept as NaN (load_mulan imputes "
                      f"them from the training split; Standardizer with the training mean)", UserWarning, stacklevel=2)
    return _encode(data, layout)


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


def _xml_label_names(name: str, xml: str | None, label_attributes: int | None) -> list[str] | None:
    """The label names of the Mulan XML ``xml``, None without one (then ``label_attributes`` is needed)."""
    label_names = read_mulan_labels(xml) if xml and os.path.isfile(xml) else None
    if label_names is None and label_attributes is None:
        where = os.path.abspath(xml) if xml else f"{name}.xml (the Mulan catalog has none)"
        raise ValueError(f"no Mulan label file {where}: pass label_attributes=L to take the last L attributes "
                         f"of the ARFF file as the labels")
    if label_names is not None and label_attributes is not None and label_attributes != len(label_names):
        raise ValueError(f"label_attributes={label_attributes} disagrees with the {len(label_names)} labels "
                         f"listed in {xml}")
    return label_names


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
        declared = set(names)
        missing = [n for n in label_names if n not in declared]
        if missing:
            close = difflib.get_close_matches(missing[0], names, n=3)
            hint = f" (closest attribute names to {missing[0]!r}: {close})" if close else ""
            raise ValueError(f"{data.path}: label(s) {missing} from the Mulan XML are not attributes "
                             f"of the ARFF file{hint}")
        wanted = set(label_names)
        return [j for j, n in enumerate(names) if n in wanted]
    L = label_attributes
    check_int(L, "label_attributes", 1, len(names) - 1,
              f"an int in [1, {len(names) - 1}] (the file has {len(names)} attributes)")
    return list(range(len(names) - L, len(names)))


@dataclass(frozen=True)
class _Layout:
    """The role of every attribute of a file: label and feature column indices (ARFF order), and the
    names of the ignored (string) attributes."""

    labels: list[int]
    features: list[int]
    ignored: list[str]


def _layout(data: ArffData, label_names: list[str] | None, label_attributes: int | None) -> _Layout:
    labels = _label_columns(data, label_names, label_attributes)
    is_label = set(labels)
    rest = [a for j, a in enumerate(data.attributes) if j not in is_label]
    features = [j for j, a in enumerate(data.attributes) if j not in is_label and a.kind != "string"]
    if not features:
        raise ValueError(f"{data.path}: no feature attributes left besides the labels (string attributes "
                         f"are ignored)")
    return _Layout(labels, features, [a.name for a in rest if a.kind == "string"])


def _encode(data: ArffData, layout: _Layout) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """(x float32 [N, D], y int64 [N, L], feature names [D], label names [L]) of a file; NaN stays NaN."""
    x, feature_names = _features(data, layout.features)
    return x, _labels(data, layout.labels), feature_names, [data.attributes[j].name for j in layout.labels]


def _labels(data: ArffData, columns: list[int]) -> np.ndarray:
    """The labels int64 [N, L] of the label attributes ``columns``; ValueError naming the attribute that is
    not binary, or the line of a value other than 0 and 1."""
    for j in columns:
        attr = data.attributes[j]
        if attr.kind != "numeric" and not attr.is_binary_nominal:
            raise ValueError(f"{data.path}: label attribute {attr.name!r} must be binary {{0,1}}, "
                             f"it is declared {_declared(attr)}")
    y = _as_numbers(data, columns)
    bad = (y != 0.0) & (y != 1.0)
    if bad.any():
        c = int(np.flatnonzero(bad.any(0))[0])
        i = int(np.flatnonzero(bad[:, c])[0])
        v = "missing ('?')" if np.isnan(y[i, c]) else repr(float(y[i, c]))
        raise ValueError(f"{data.path}, line {data.lines[i]}: label {data.attributes[columns[c]].name!r} has "
                         f"value {v}; labels must be 0 or 1")
    return y.astype(np.int64)


def _features(data: ArffData, columns: list[int]) -> tuple[np.ndarray, list[str]]:
    """The features float32 [N, D] and their names [D] of the feature attributes ``columns``, encoded as
    the module docstring says; NaN where a value is missing."""
    attrs = [data.attributes[j] for j in columns]
    names = [_column_names(a) for a in attrs]
    offsets = np.cumsum([0, *map(len, names)])
    single = [k for k, a in enumerate(attrs) if _is_single(a)]
    x = np.empty((data.num_rows, offsets[-1]), dtype=np.float32)
    for start in range(0, len(single), FEATURE_BLOCK):  # float64 temporaries of N x FEATURE_BLOCK values
        block = single[start:start + FEATURE_BLOCK]
        x[:, offsets[block]] = _as_numbers(data, [columns[k] for k in block])
    for k, a in enumerate(attrs):
        if not _is_single(a):
            x[:, offsets[k]:offsets[k + 1]] = _one_hot(a, data.values[:, columns[k]])
    return x, [name for block in names for name in block]


def _is_single(attr: ArffAttribute) -> bool:
    """Numeric, or nominal over {0,1}: one column holding the value."""
    return attr.kind == "numeric" or attr.is_binary_nominal


def _first_one_hot(attr: ArffAttribute) -> int:
    """Index of the first declared value that gets a column: the second of two values, else the first."""
    return len(attr.values) - 1 if len(attr.values) <= 2 else 0


def _column_names(attr: ArffAttribute) -> list[str]:
    if _is_single(attr):
        return [attr.name]
    return [f"{attr.name}={v}" for v in attr.values[_first_one_hot(attr):]]


def _one_hot(attr: ArffAttribute, index: np.ndarray) -> np.ndarray:
    """Indicator columns float64 [N, k] of the declared values from ``_first_one_hot`` on, from the value
    indices [N] of a nominal attribute; NaN rows where missing."""
    onehot = (index[:, None] == np.arange(_first_one_hot(attr), len(attr.values))).astype(np.float64)
    onehot[np.isnan(index)] = np.nan
    return onehot


def _as_numbers(data: ArffData, columns: list[int]) -> np.ndarray:
    """The values float64 [N, C] of numeric attributes and nominal attributes over {0,1} (``columns``): a
    number as it is, a nominal's declared value from its index (first + index * (last - first), exact for
    values in {0, 1}); NaN where missing."""
    values = data.values[:, columns]
    attrs = [data.attributes[j] for j in columns]
    nominal = np.array([a.kind == "nominal" for a in attrs], dtype=bool)
    if nominal.any():
        first = np.array([float(a.values[0]) for a in attrs if a.kind == "nominal"])
        last = np.array([float(a.values[-1]) for a in attrs if a.kind == "nominal"])
        values[:, nominal] = first + values[:, nominal] * (last - first)
    return values


def _train_and_test(train_path: str, test_path: str | None, test_fraction: float, seed: int
                    ) -> tuple[ArffData, ArffData, bool]:
    """(train, test, test_from_file): the two files, or a seeded random split of the training file."""
    train = _with_rows(load_arff(train_path))
    if test_path and os.path.isfile(test_path):
        return train, _with_rows(load_arff(test_path)), True
    train_idx, test_idx = _split_indices(train.num_rows, test_fraction, seed)
    return *train.split(train_idx, test_idx), False


def _with_rows(data: ArffData) -> ArffData:
    """``data``, or ValueError if the file has no data rows."""
    if data.num_rows == 0:
        raise ValueError(f"{data.path}: the ARFF file has no data rows")
    return data


def _check_same_header(train: ArffData, test: ArffData) -> None:
    """ValueError unless both files declare the same attributes (names, types, nominal values in order)."""
    if train.path == test.path:
        return
    if len(train.attributes) != len(test.attributes):
        raise ValueError(f"{test.path} declares {len(test.attributes)} attributes, {train.path} "
                         f"{len(train.attributes)}: the train and test files must have the same header")
    for j, (a, b) in enumerate(zip(train.attributes, test.attributes)):
        if a != b:
            raise ValueError(f"{test.path} and {train.path} declare attribute {j + 1} differently: {b.name!r} "
                             f"{_declared(b)} vs {a.name!r} {_declared(a)}; the train and test files must have "
                             f"the same header")


def _declared(attr: ArffAttribute) -> str:
    """The declared type, cut to 80 characters (genbase declares a nominal of 662 protein IDs)."""
    text = attr.declaration
    return text if len(text) <= 80 else text[:77] + "..."


def _impute_missing(train: ArffData, test: ArffData, features: list[int], test_from_file: bool) -> None:
    """Fill the missing values of the feature attributes of both splits in place, from the training split
    (module docstring), and say how many with one warning."""
    missing_tr, missing_te = np.isnan(train.values)[:, features], np.isnan(test.values)[:, features]
    if not (missing_tr.any() or missing_te.any()):
        return
    for k in np.flatnonzero(missing_tr.any(0) | missing_te.any(0)):
        j = features[k]
        fill = _fill_value(train.attributes[j], train.values[~missing_tr[:, k], j])
        train.values[missing_tr[:, k], j] = fill
        test.values[missing_te[:, k], j] = fill
    where = f"the test file {test.path}" if test_from_file else "the test split"
    warnings.warn(f"{train.path}: {int(missing_tr.sum())} missing feature value(s) ('?') in the training split "
                  f"and {int(missing_te.sum())} missing in {where} imputed with the training mean (numeric "
                  f"attributes) or the most frequent training value (nominal attributes)", UserWarning, stacklevel=3)


def _fill_value(attr: ArffAttribute, present: np.ndarray) -> float:
    """The training mean of a numeric attribute, or the index of a nominal's most frequent value (ties: the
    first declared), from its present training values [M]; 0 (the first declared value) when M = 0."""
    if present.size == 0:
        return 0.0
    if attr.kind == "numeric":
        return float(present.mean())
    return float(np.bincount(present.astype(np.int64), minlength=len(attr.values)).argmax())


def _warn_ignored(path: str, names: list[str]) -> None:
    warnings.warn(f"{path}: ignoring {len(names)} string attribute(s) {names} (not features, not labels)",
                  UserWarning, stacklevel=3)
