"""Every Mulan dataset loads (issue 32, item 5): quoted attribute names, nominal and string attributes,
sparse rows with nominals, missing values and corrupt rows, on small synthetic ARFF + XML fixtures; then
the real datasets of the package's data cache (skipped, saying where, when the cache lacks them)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cached_mulan

from structtorch.data import arff_to_multilabel, load_arff, load_mulan, load_mulan_splits

XML_HEAD = '<?xml version="1.0" encoding="utf-8"?>\n<labels xmlns="http://mulan.sourceforge.net/labels">\n'


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _dataset(root: Path, name: str, header: str, train: str, test: str | None, xml_labels: str) -> Path:
    """<root>/<name>/<name>-train.arff (+ -test.arff) and <name>.xml; header ends with '@data'."""
    _write(root / name / f"{name}-train.arff", header + "\n" + train)
    if test is not None:
        _write(root / name / f"{name}-test.arff", header + "\n" + test)
    _write(root / name / f"{name}.xml", XML_HEAD + xml_labels + "</labels>\n")
    return root


# ---------------------------------------------------------------------- quoted names (birds)
BIRDS_HEADER = r"""@relation birds
@attribute 'audio feature' numeric
@attribute 'a\\b \%50' numeric
@attribute 'Brown Creeper' {0,1}
@attribute 'Swainson\'s Thrush' {0,1}
@attribute "Hammond's \"Flycatcher\"" {0,1}
@attribute	'MacGillivray\'s Warbler'	{0,1}
@attribute Stellar\'s {0,1}
@data"""
BIRDS_XML = """<label name="Brown Creeper"></label>
<label name="Swainson&apos;s Thrush"></label>
<label name='Hammond&apos;s &quot;Flycatcher&quot;'/>
<label name="MacGillivray&#39;s Warbler"/>
<label name="Stellar\\'s"/>
"""
BIRDS_LABELS = ["Brown Creeper", "Swainson's Thrush", 'Hammond\'s "Flycatcher"', "MacGillivray's Warbler",
                "Stellar\\'s"]


def test_quoted_attribute_names_are_unquoted_and_unescaped(tmp_path: Path) -> None:
    path = _write(tmp_path / "b.arff", BIRDS_HEADER + "\n1.5,2,0,1,1,0,1\n")
    assert load_arff(path).names == ["audio feature", "a\\b %50", *BIRDS_LABELS]


def test_birds_style_label_names_match_the_xml(tmp_path: Path) -> None:
    root = _dataset(tmp_path, "quoted", BIRDS_HEADER, "1.5,2,0,1,1,0,1\n0.5,3,1,0,0,1,0\n",
                    "2,2,1,1,1,1,1\n", BIRDS_XML)
    x, y, feats, labels = load_mulan("quoted", "train", root=root)
    assert labels == BIRDS_LABELS and feats == ["audio feature", "a\\b %50"]
    np.testing.assert_array_equal(y.numpy(), [[0, 1, 1, 0, 1], [1, 0, 0, 1, 0]])
    assert torch.equal(x, torch.tensor([[1.5, 2.0], [0.5, 3.0]]))


@pytest.mark.parametrize("line, what", [
    ("@attribute 'unterminated {0,1}", "unterminated"),
    ("@attribute 'f0' numeric", "declared twice"),
])
def test_bad_attribute_names_name_file_and_line(tmp_path: Path, line: str, what: str) -> None:
    path = _write(tmp_path / "n.arff", f"@relation r\n@attribute f0 numeric\n{line}\n@data\n1,1\n")
    with pytest.raises(ValueError, match=rf"n\.arff, line 3: .*{what}"):
        load_arff(path)


# ---------------------------------------------------------------------- nominal and string features
NOMINAL_HEADER = """@relation nominal
@attribute id string
@attribute PS00010 {YES,NO}
@attribute time {lunch,'happy hour',dinner}
@attribute location {2,10,1}
@attribute word {0,1}
@attribute size numeric
@attribute y0 {0,1}
@attribute y1 {0,1}
@data"""
NOMINAL_XML = '<label name="y0"/><label name="y1"/>\n'
NOMINAL_TRAIN = "'a',YES,lunch,2,1,0.5,1,0\n'b',NO,'happy hour',10,0,1.5,0,1\n'c b',YES,lunch,10,1,2.5,1,1\n"
NOMINAL_TEST = "'d',NO,dinner,1,0,3.5,0,0\n"  # dinner and location 1 never occur in training
NOMINAL_FEATURES = ["PS00010=NO", "time=lunch", "time=happy hour", "time=dinner", "location=2", "location=10",
                    "location=1", "word", "size"]
NOMINAL_X_TRAIN = [[0, 1, 0, 0, 1, 0, 0, 1, 0.5], [1, 0, 1, 0, 0, 1, 0, 0, 1.5], [0, 1, 0, 0, 0, 1, 0, 1, 2.5]]
NOMINAL_X_TEST = [[1, 0, 0, 1, 0, 0, 1, 0, 3.5]]


@pytest.mark.parametrize("block", [None, 1])
def test_nominal_features_are_one_hot_with_the_header_vocabulary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  block: int | None) -> None:
    """block: the single-column features converted one column at a time (``FEATURE_BLOCK``), as in blocks of a
    wide file's columns."""
    if block is not None:
        monkeypatch.setattr("structtorch.data.mulan.FEATURE_BLOCK", block)
    root = _dataset(tmp_path, "nom", NOMINAL_HEADER, NOMINAL_TRAIN, NOMINAL_TEST, NOMINAL_XML)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the string attribute
        d = load_mulan_splits("nom", root=root)
    assert d.feature_names == NOMINAL_FEATURES and d.label_names == ["y0", "y1"]
    np.testing.assert_array_equal(d.x_train.numpy(), NOMINAL_X_TRAIN)
    np.testing.assert_array_equal(d.x_test.numpy(), NOMINAL_X_TEST)
    assert d.x_train.dtype == torch.float32


def test_only_nominal_features_genbase_style(tmp_path: Path) -> None:
    header = "@relation g\n@attribute PS1 {YES,NO}\n@attribute PS2 {YES,NO}\n@attribute y0 {0,1}\n@data"
    root = _dataset(tmp_path, "gen", header, "YES,NO,1\nNO,NO,0\n", "NO,YES,1\n", '<label name="y0"/>')
    x, y, feats, _ = load_mulan("gen", "test", root=root)
    assert feats == ["PS1=NO", "PS2=NO"]
    np.testing.assert_array_equal(x.numpy(), [[1, 0]])


def test_zero_one_nominals_keep_their_value_in_either_declared_order(tmp_path: Path) -> None:
    header = "@relation z\n@attribute w {1,0}\n@attribute v {1}\n@attribute y0 {1,0}\n@attribute y1 {0,1}\n@data"
    rows = "1,1,0,1\n0,1,1,0\n{0 0, 2 0}\n"  # sparse: an omitted nominal is its first declared value
    root = _dataset(tmp_path, "z", header, rows, rows, '<label name="y0"/><label name="y1"/>')
    x, y, feats, _ = load_mulan("z", "test", root=root)
    assert feats == ["w", "v"] and torch.equal(x, torch.tensor([[1.0, 1], [0, 1], [0, 1]]))
    assert torch.equal(y, torch.tensor([[0, 1], [1, 0], [0, 0]]))


def test_train_and_test_headers_must_agree(tmp_path: Path) -> None:
    root = _dataset(tmp_path, "nom", NOMINAL_HEADER, NOMINAL_TRAIN, None, NOMINAL_XML)
    _write(root / "nom" / "nom-test.arff", NOMINAL_HEADER.replace("{2,10,1}", "{1,2,10}") + "\n" + NOMINAL_TEST)
    with pytest.raises(ValueError, match=r"nom-test\.arff and .*nom-train\.arff declare attribute 4 differently: "
                                         r"'location' \{1,2,10\} vs 'location' \{2,10,1\}"):
        load_mulan_splits("nom", root=root)


def test_string_attributes_are_ignored_and_said_once(tmp_path: Path) -> None:
    root = _dataset(tmp_path, "nom", NOMINAL_HEADER, NOMINAL_TRAIN, NOMINAL_TEST, NOMINAL_XML)
    with pytest.warns(UserWarning) as record:
        load_mulan_splits("nom", root=root)
    messages = [str(w.message) for w in record]
    assert len(messages) == 1 and "'id'" in messages[0] and "string" in messages[0]


def test_sparse_rows_with_nominals_equal_dense(tmp_path: Path) -> None:
    """Sparse rows omit index 0 of a nominal: the first declared value (YES, lunch, 2)."""
    header = NOMINAL_HEADER.replace("@attribute id string\n", "")
    dense = "NO,lunch,2,1,0.5,1,0\nYES,dinner,10,0,0,0,1\n"
    sparse = "{0 NO, 3 1, 4 0.5, 5 1}\n{1 dinner, 2 10, 6 1}\n"
    a = load_mulan_splits("d", root=_dataset(tmp_path, "d", header, dense, None, NOMINAL_XML), test_fraction=0.5)
    b = load_mulan_splits("s", root=_dataset(tmp_path, "s", header, sparse, None, NOMINAL_XML), test_fraction=0.5)
    assert a.feature_names == b.feature_names == NOMINAL_FEATURES
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.x_test, b.x_test)
    assert torch.equal(a.y_train, b.y_train) and torch.equal(a.y_test, b.y_test)


# ---------------------------------------------------------------------- missing values
MISSING_HEADER = """@relation m
@attribute f numeric
@attribute c {a,b,c}
@attribute w {0,1}
@attribute y0 {0,1}
@data"""


def test_missing_values_are_imputed_from_the_training_file(tmp_path: Path) -> None:
    train = "1,a,1,1\n?,b,1,0\n5,b,?,1\n{1 c, 3 1}\n"  # f mean (1 + 5 + 0) / 3 = 2, c mode b, w mode 1
    test = "?,?,?,0\n{0 ?, 1 ?, 2 ?, 3 1}\n"
    root = _dataset(tmp_path, "m", MISSING_HEADER, train, test, '<label name="y0"/>')
    with pytest.warns(UserWarning, match=r"2 missing .* 6 missing .*imputed .*training mean .*most frequent"):
        d = load_mulan_splits("m", root=root)
    assert d.feature_names == ["f", "c=a", "c=b", "c=c", "w"]
    np.testing.assert_array_equal(d.x_train.numpy(), [[1, 1, 0, 0, 1], [2, 0, 1, 0, 1], [5, 0, 1, 0, 1],
                                                      [0, 0, 0, 1, 0]])
    np.testing.assert_array_equal(d.x_test.numpy(), [[2, 0, 1, 0, 1]] * 2)


def test_missing_values_of_a_random_split_use_its_training_part(tmp_path: Path) -> None:
    header = MISSING_HEADER.replace("@data", "@attribute imputed {0,1}\n@data")
    rows = "".join(f"{10 * i},b,1,{i % 2},0\n" for i in range(9)) + "?,?,?,1,1\n"  # the last row is all '?'
    root = _dataset(tmp_path, "r", header, rows, None, '<label name="y0"/><label name="imputed"/>')
    with pytest.warns(UserWarning, match="imputed"):
        d = load_mulan_splits("r", root=root, test_fraction=0.3, seed=0)
    filled = d.y_train[:, 1] == 1
    row = torch.cat([d.x_train[filled], d.x_test[d.y_test[:, 1] == 1]])
    mean = d.x_train[~filled, 0].double().mean().float()  # the training part's other rows only
    assert torch.equal(row, torch.stack([mean, *torch.tensor([0.0, 1.0, 0.0, 1.0])])[None])


def test_arff_to_multilabel_alone_keeps_missing_as_nan_and_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.arff", MISSING_HEADER + "\n1,?,1,1\n?,b,1,0\n")
    with pytest.warns(UserWarning, match=r"2 missing .*NaN"):
        x, _, _, _ = arff_to_multilabel(load_arff(path), ["y0"])
    assert np.isnan(x[0, 1:4]).all() and np.isnan(x[1, 0]) and not np.isnan(x[0, 0])


# ---------------------------------------------------------------------- corrupt rows
@pytest.mark.parametrize("row", [
    ",".join(["0.123456789"] * 60),  # too many values, 700 characters
    "1," + "z" * 600 + ",1,1",  # an undeclared nominal value
    "{0 1, 9 " + "1" * 600 + "}",  # a sparse index out of range
], ids=["too-many-values", "undeclared-nominal", "sparse-index"])
def test_corrupt_row_error_is_short(tmp_path: Path, row: str) -> None:
    path = _write(tmp_path / "bad.arff", MISSING_HEADER + "\n1,a,1,1\n" + row + "\n")
    with pytest.raises(ValueError, match=r"bad\.arff, line 8: ") as err:
        load_arff(path)
    msg = str(err.value)
    assert re.search(r"\.\.\. \(\d{3} characters\)", msg) and row[:81] not in msg and len(msg) < len(str(path)) + 300


# ---------------------------------------------------------------------- the real data (package cache)
def test_real_birds_labels_with_apostrophes() -> None:
    x, y, feats, labels = cached_mulan("birds", "train")
    xt, yt, feats_t, _ = cached_mulan("birds", "test")
    assert x.shape == (322, 271) and y.shape == (322, 19) and xt.shape == (323, 271) and yt.shape == (323, 19)
    assert "Swainson's Thrush" in labels and feats == feats_t and "location=17" in feats
    assert not torch.isnan(x).any() and not torch.isnan(xt).any()


def test_real_flags_nominals_are_one_hot() -> None:
    x, y, feats, _ = cached_mulan("flags", "train")
    xt, _, feats_t, _ = cached_mulan("flags", "test")
    assert x.shape == (129, 43) and y.shape == (129, 7) and xt.shape == (65, 43) and feats == feats_t
    assert feats[:6] == [f"landmass={v}" for v in range(1, 7)] and "religion=0" in feats and "crescent" in feats
    for prefix in ("landmass=", "zone=", "language=", "religion="):  # exactly one value per row
        block = x[:, [j for j, f in enumerate(feats) if f.startswith(prefix)]]
        assert torch.equal(block.sum(1), torch.ones(len(x)))


def _mulan_like_script():
    """scripts/mulan_like.py as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mulan_like",
                                                  Path(__file__).resolve().parents[1] / "scripts" / "mulan_like.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mulan_like_writes_a_folder_the_cli_reads_as_the_synthetic_data(tmp_path: Path) -> None:
    """scripts/mulan_like.py: a Mulan-shaped folder (sparse ARFF, {0,1} attributes, label XML) that load_mulan reads
    back as exactly the rows of sparse_multilabel, split as the shape says."""
    from structtorch.data import sparse_multilabel

    mulan_like = _mulan_like_script()
    train, test, D, L = mulan_like.SHAPES["medical"]
    mulan_like.write_dataset(tmp_path, "medical", seed=3)
    data = load_mulan_splits("medical-like", root=tmp_path, progress=False)
    x, y = sparse_multilabel(train + test, num_features=D, num_labels=L, seed=3)
    assert data.label_names == [f"label{j}" for j in range(L)]
    assert torch.equal(data.y_train, y[:train]) and torch.equal(data.y_test, y[train:])
    assert torch.equal(data.x_train, x[:train]) and torch.equal(data.x_test, x[train:])


def test_mulan_like_writes_dense_numeric_features_for_mediamills_shape(tmp_path: Path, monkeypatch) -> None:
    """A dense shape (mediamill's, here with fewer rows) is dense ARFF with numeric attributes: load_mulan reads back
    the labels of sparse_multilabel and the features y A + noise of ``dense_features`` (to the 4 decimals
    written)."""
    from structtorch.data import sparse_multilabel

    mulan_like = _mulan_like_script()
    assert "mediamill" in mulan_like.DENSE and mulan_like.SHAPES["mediamill"][2:] == (120, 101)
    monkeypatch.setitem(mulan_like.SHAPES, "mediamill", (40, 15, 12, 6))
    mulan_like.write_dataset(tmp_path, "mediamill", seed=2, cardinality=2.0)
    data = load_mulan_splits("mediamill-like", root=tmp_path, progress=False)
    _, y = sparse_multilabel(55, num_features=12, num_labels=6, seed=2, cardinality=2.0)
    x = mulan_like.dense_features(y, 12, seed=2)
    assert torch.equal(data.y_train, y[:40]) and torch.equal(data.y_test, y[40:])
    assert torch.allclose(data.x_train, x[:40], atol=5e-5) and torch.allclose(data.x_test, x[40:], atol=5e-5)
    assert not bool(((data.x_train == 0) | (data.x_train == 1)).all())  # numbers, not binary words


def test_mulan_like_writes_one_file_for_a_shape_without_a_split(tmp_path: Path) -> None:
    """A shape with no test rows (cal500's) is one <name>.arff; load_mulan splits 30% of its rows off as the test
    set, every row in exactly one split."""
    mulan_like = _mulan_like_script()
    rows, test, D, L = mulan_like.SHAPES["cal500"]
    assert test == 0
    folder = mulan_like.write_dataset(tmp_path, "cal500", cardinality=26.04)
    assert sorted(p.name for p in folder.iterdir()) == ["cal500-like.arff", "cal500-like.xml"]
    data = load_mulan_splits("cal500-like", root=tmp_path, progress=False)
    assert len(data.x_test) == round(0.3 * rows) and len(data.x_train) + len(data.x_test) == rows
    assert data.x_train.shape[1] == D and data.y_train.shape[1] == L
    assert abs(float(torch.cat([data.y_train, data.y_test]).sum(1).double().mean()) - 26.04) < 1.0


@pytest.mark.parametrize("cardinality", [1.0, 1.25, 3.38])
def test_sparse_multilabel_draws_about_cardinality_labels_a_row(cardinality: float) -> None:
    """The shape's label count: 1 + Poisson(cardinality - 1) labels a row (enron: 3.38), every row labelled."""
    from structtorch.data import sparse_multilabel

    _, y = sparse_multilabel(4000, num_features=300, num_labels=53, seed=0, cardinality=cardinality)
    per_row = y.sum(1).double()
    assert bool((per_row >= 1).all())
    assert abs(float(per_row.mean()) - cardinality) <= 4 * ((cardinality - 1) / len(y)) ** 0.5  # 4 standard errors


@pytest.mark.parametrize("bad", [0.5, float("inf"), float("nan"), True])
def test_sparse_multilabel_rejects_a_cardinality_below_one_or_not_finite(bad: object) -> None:
    from structtorch.data import sparse_multilabel

    with pytest.raises((ValueError, TypeError), match="cardinality"):
        sparse_multilabel(10, num_features=20, num_labels=5, cardinality=bad)
