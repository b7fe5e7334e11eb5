"""ARFF / Mulan loading, standardisation, datamodules, and the synthetic CRANK generator."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cached_mulan

from structtorch import Graph
from structtorch.data import (
    MULAN_URL,
    MultilabelDataModule,
    Standardizer,
    SyntheticDataModule,
    crank_synthetic,
    kfold_indices,
    load_arff,
    load_mulan,
    load_mulan_splits,
    pruefer_decode,
    random_tree,
    read_mulan_labels,
    train_val_indices,
)
from structtorch.inference import brute_force_map

HEADER = """% a tiny multi-label data set
@relation tiny

@attribute f0 numeric
@attribute f1 REAL
@attribute y0 {0,1}
@attribute y1 {0,1}
@attribute y2 {0,1}

@data
"""
X = np.array([[1.0, 0.0], [2.0, -1.0], [0.0, 3.0], [4.0, 0.5], [-1.0, 2.0], [0.0, 0.0]])
Y = np.array([[1, 0, 1], [0, 1, 1], [0, 0, 0], [1, 1, 1], [0, 0, 1], [1, 0, 0]])
XML = """<?xml version="1.0" encoding="utf-8"?>
<labels xmlns="http://mulan.sourceforge.net/labels">
<label name="y0"></label>
<label name="y1"></label>
<label name="y2"></label>
</labels>
"""


def _dense_rows(x: np.ndarray, y: np.ndarray) -> str:
    return "".join(",".join([*(f"{v:g}" for v in xr), *map(str, yr)]) + "\n" for xr, yr in zip(x, y))


def _sparse_rows(x: np.ndarray, y: np.ndarray) -> str:
    rows = []
    for xr, yr in zip(x, y):
        vals = [*xr, *yr]
        rows.append("{" + ", ".join(f"{j} {v:g}" for j, v in enumerate(vals) if v != 0) + "}\n")
    return "".join(rows)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _dataset(root: Path, name: str = "tiny", x: np.ndarray = X, y: np.ndarray = Y, n_train: int = 4,
             sparse: bool = False, xml: bool = True, test: bool = True) -> Path:
    rows = _sparse_rows if sparse else _dense_rows
    d = root / name
    _write(d / f"{name}-train.arff", HEADER + rows(x[:n_train], y[:n_train]))
    if test:
        _write(d / f"{name}-test.arff", HEADER + rows(x[n_train:], y[n_train:]))
    if xml:
        _write(d / f"{name}.xml", XML)
    return root


def _big(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=(n, 2)) * 3 + np.array([5.0, -2.0]), 3)
    x[:, 0] = np.arange(n)  # a row id, to follow rows through splits
    return x, rng.integers(0, 2, size=(n, 3))


# ---------------------------------------------------------------------- load_arff
def test_load_arff_dense(tmp_path: Path) -> None:
    d = load_arff(_write(tmp_path / "a.arff", HEADER + _dense_rows(X, Y)))
    assert d.relation == "tiny" and d.names == ["f0", "f1", "y0", "y1", "y2"]
    assert [a.kind for a in d.attributes] == ["numeric", "numeric", "nominal", "nominal", "nominal"]
    assert not d.sparse and d.num_rows == 6
    np.testing.assert_allclose(d.values, np.hstack([X, Y]))
    assert d.lines.tolist() == list(range(11, 17))  # 1-based file lines of the rows


def test_load_arff_sparse_equals_dense(tmp_path: Path) -> None:
    dense = load_arff(_write(tmp_path / "d.arff", HEADER + _dense_rows(X, Y)))
    sparse = load_arff(_write(tmp_path / "s.arff", HEADER + _sparse_rows(X, Y)))
    assert sparse.sparse
    np.testing.assert_array_equal(sparse.values, dense.values)
    assert sparse.lines.tolist() == dense.lines.tolist()


def test_load_arff_mixed_sparse_and_dense_rows(tmp_path: Path) -> None:
    text = HEADER + _sparse_rows(X[:3], Y[:3]) + _dense_rows(X[3:], Y[3:])
    np.testing.assert_allclose(load_arff(_write(tmp_path / "m.arff", text)).values, np.hstack([X, Y]))


def test_load_arff_missing_values_and_comments(tmp_path: Path) -> None:
    text = HEADER + "% comment\n\n1,?,0,1,0\n"
    d = load_arff(_write(tmp_path / "m.arff", text))
    assert np.isnan(d.values[0, 1]) and d.lines.tolist() == [13]


def test_split_is_two_subsets_sharing_the_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ArffData.split gives subset's two parts (values, lines, strings) as views of the file's values reordered in
    place, a few columns at a time: no second copy of a file's values (at bookmarks' shape 1.7 GB)."""
    import structtorch.data.arff as arff_module

    monkeypatch.setattr(arff_module, "REORDER_COLUMNS", 2)  # several blocks of the 6 columns
    x, y = _big(9)
    text = HEADER.replace("@attribute f0", "@attribute id string\n@attribute f0")
    rows = "".join(f"'r{i}'," + row for i, row in enumerate(_dense_rows(x, y).splitlines(keepends=True)))
    path = _write(tmp_path / "s.arff", text + rows)
    first, second = np.array([4, 0, 7, 2, 8]), np.array([5, 1, 3, 6])
    expected = [load_arff(path).subset(rows) for rows in (first, second)]
    data = load_arff(path)
    parts = data.split(first, second)
    for part, want in zip(parts, expected):
        np.testing.assert_array_equal(part.values, want.values)
        assert part.lines.tolist() == want.lines.tolist() and part.strings == want.strings
        assert np.shares_memory(part.values, data.values)
    with pytest.raises(ValueError, match="each of the 9 rows once"):
        load_arff(path).split(first, np.array([5, 1, 3, 3]))


@pytest.mark.parametrize("case, row, line", [
    ("bad numeric value", "1,abc,0,1,0", 12),
    ("wrong number of columns (too many)", "1,2,0,1,0,7", 12),
    ("wrong number of columns (too few)", "1,2,0", 12),
    ("undeclared nominal value", "1,2,0,5,0", 12),
    ("sparse index out of range", "{0 1, 9 1}", 12),
    ("sparse bad value", "{0 1, 1 x}", 12),
])
def test_load_arff_malformed_rows_name_file_and_line(tmp_path: Path, case: str, row: str, line: int) -> None:
    path = _write(tmp_path / "bad.arff", HEADER + "1,2,0,1,0\n" + row + "\n3,4,1,1,1\n")
    with pytest.raises(ValueError, match=f"line {line}") as err:
        load_arff(path)
    assert str(path) in str(err.value)


def test_load_arff_bad_value_deep_in_the_file(tmp_path: Path) -> None:
    rows = _dense_rows(X, Y).splitlines()
    rows[4] = "4,oops,1,1,1"
    path = _write(tmp_path / "bad.arff", HEADER + "\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=r"bad\.arff, line 15: .*numerical"):
        load_arff(path)


def test_load_arff_missing_data_section(tmp_path: Path) -> None:
    path = _write(tmp_path / "nodata.arff", HEADER.replace("@data\n", "") + _dense_rows(X, Y))
    with pytest.raises(ValueError, match=r"nodata\.arff.*no '@data'"):
        load_arff(path)


def test_load_arff_bad_header(tmp_path: Path) -> None:
    path = _write(tmp_path / "h.arff", HEADER.replace("@attribute f1 REAL", "@attribute f1 date"))
    with pytest.raises(ValueError, match=r"h\.arff, line 5: .*ATTRIBUTE type"):
        load_arff(path)


def test_load_arff_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.arff"):
        load_arff(tmp_path / "nope.arff")


# ---------------------------------------------------------------------- load_mulan
@pytest.mark.parametrize("sparse", [False, True])
def test_load_mulan_with_xml(tmp_path: Path, sparse: bool) -> None:
    root = _dataset(tmp_path, sparse=sparse)
    x, y, feats, labels = load_mulan("tiny", "train", root=root)
    assert x.dtype == torch.float32 and y.dtype == torch.long
    assert feats == ["f0", "f1"] and labels == ["y0", "y1", "y2"]
    np.testing.assert_allclose(x.numpy(), X[:4])
    np.testing.assert_array_equal(y.numpy(), Y[:4])
    xt, yt, _, _ = load_mulan("tiny", "test", root=root)
    np.testing.assert_array_equal(yt.numpy(), Y[4:])
    xa, ya, _, _ = load_mulan("tiny", "all", root=root)
    np.testing.assert_allclose(xa.numpy(), X)


def test_load_mulan_without_xml_uses_last_label_attributes(tmp_path: Path) -> None:
    root = _dataset(tmp_path, xml=False)
    x, y, feats, labels = load_mulan("tiny", "train", root=root, label_attributes=3)
    assert feats == ["f0", "f1"] and labels == ["y0", "y1", "y2"]
    np.testing.assert_array_equal(y.numpy(), Y[:4])
    x2, y2, feats2, labels2 = load_mulan("tiny", "train", root=root, label_attributes=2)
    assert feats2 == ["f0", "f1", "y0"] and labels2 == ["y1", "y2"]
    with pytest.raises(ValueError, match="label_attributes"):
        load_mulan("tiny", "train", root=root)


def test_load_mulan_xml_labels_anywhere_and_namespaced(tmp_path: Path) -> None:
    header = HEADER.replace("@attribute f0 numeric\n", "").replace("@attribute y2 {0,1}\n",
                                                                  "@attribute y2 {0,1}\n@attribute f0 numeric\n")
    rows = "".join(f"{x[1]:g},{y[0]},{y[1]},{y[2]},{x[0]:g}\n" for x, y in zip(X, Y))
    d = tmp_path / "mid"
    _write(d / "mid-train.arff", header + rows)
    _write(d / "mid-test.arff", header + rows)
    _write(d / "mid.xml", XML)
    assert read_mulan_labels(d / "mid.xml") == ["y0", "y1", "y2"]
    x, y, feats, labels = load_mulan("mid", "train", root=tmp_path)
    assert feats == ["f1", "f0"] and labels == ["y0", "y1", "y2"]
    np.testing.assert_allclose(x.numpy(), X[:, ::-1])
    np.testing.assert_array_equal(y.numpy(), Y)


def test_load_mulan_ignores_string_attributes_and_encodes_nominal_ones(tmp_path: Path) -> None:
    header = HEADER.replace("@attribute f0 numeric\n",
                            "@attribute id string\n@attribute colour {red,green}\n"
                            "@attribute word {0,1}\n@attribute f0 numeric\n")
    rows = "".join(f"'ex {i}',{'red' if i % 2 else 'green'},{i % 2},{r}" for i, r in
                   enumerate(_dense_rows(X, Y).splitlines(keepends=True)))
    d = tmp_path / "ids"
    _write(d / "ids-train.arff", header + rows)
    _write(d / "ids-test.arff", header + rows)
    _write(d / "ids.xml", XML)
    with pytest.warns(UserWarning, match=r"ignoring 1 string attribute\(s\) \['id'\]"):
        x, y, feats, labels = load_mulan("ids", "train", root=tmp_path)
    assert feats == ["colour=green", "word", "f0", "f1"]  # a {0,1} nominal non-label attribute is as it is
    np.testing.assert_allclose(x[:, 0].numpy(), 1 - np.arange(6) % 2)
    np.testing.assert_allclose(x[:, 1].numpy(), np.arange(6) % 2)
    np.testing.assert_allclose(x[:, 2:].numpy(), X)
    np.testing.assert_array_equal(y.numpy(), Y)


def test_load_mulan_bad_label_value_names_line(tmp_path: Path) -> None:
    header = HEADER.replace("@attribute y1 {0,1}", "@attribute y1 numeric")
    d = tmp_path / "lab"
    _write(d / "lab-train.arff", header + "1,2,0,1,0\n1,2,0,2,0\n")
    _write(d / "lab.xml", XML)
    with pytest.raises(ValueError, match=r"lab-train\.arff, line 12: label 'y1' has value 2"):
        load_mulan("lab", "train", root=tmp_path)


def test_load_mulan_xml_label_not_in_arff(tmp_path: Path) -> None:
    root = _dataset(tmp_path)
    _write(root / "tiny" / "tiny.xml", XML.replace('"y2"', '"zz"'))
    with pytest.raises(ValueError, match="zz"):
        load_mulan("tiny", "train", root=root)


def test_load_mulan_missing_files_explain_how_to_get_them(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        load_mulan("scene", "train", root=tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "scene" / "scene-train.arff") in msg
    assert MULAN_URL in msg and "<name>-test.arff" in msg and "<name>.xml" in msg


def test_load_mulan_without_test_file_splits_with_seed(tmp_path: Path) -> None:
    x, y = _big(40)
    root = _dataset(tmp_path, x=x, y=y, n_train=40, test=False)
    a = load_mulan_splits("tiny", root=root, test_fraction=0.25, seed=3)
    b = load_mulan_splits("tiny", root=root, test_fraction=0.25, seed=3)
    c = load_mulan_splits("tiny", root=root, test_fraction=0.25, seed=4)
    assert not a.test_from_file and len(a.x_test) == 10 and len(a.x_train) == 30
    ids_tr, ids_te = a.x_train[:, 0].long().tolist(), a.x_test[:, 0].long().tolist()
    assert sorted(ids_tr + ids_te) == list(range(40))
    assert torch.equal(a.x_test, b.x_test) and not torch.equal(a.x_test, c.x_test)
    np.testing.assert_array_equal(a.y_test.numpy(), y[ids_te])


def test_real_emotions_counts() -> None:
    x, y, feats, labels = cached_mulan("emotions", "train")
    xt, yt, _, _ = cached_mulan("emotions", "test")
    assert x.shape == (391, 72) and y.shape == (391, 6)
    assert xt.shape == (202, 72) and yt.shape == (202, 6)
    assert len(feats) == 72 and labels[0] == "amazed-suprised"
    assert abs(y.sum(1).float().mean().item() - 1.813) < 1e-3  # label cardinality from the README


# ---------------------------------------------------------------------- standardisation
def test_standardizer_uses_train_statistics_only() -> None:
    g = torch.Generator().manual_seed(0)
    x_train = torch.randn(50, 3, generator=g) * torch.tensor([1.0, 5.0, 0.0]) + 7
    x_test = torch.randn(20, 3, generator=g) * 10 - 3
    s = Standardizer.fit(x_train)
    z = s.transform(x_train)
    torch.testing.assert_close(z.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(z[:, :2].std(0, unbiased=False), torch.ones(2), atol=1e-5, rtol=0)
    assert torch.isfinite(s.transform(x_test)).all() and s.std[2] == 1.0  # constant feature: std -> 1
    expected = (x_test - x_train.mean(0)) / torch.where(x_train.std(0, unbiased=False) > 1e-6,
                                                         x_train.std(0, unbiased=False), torch.ones(3))
    torch.testing.assert_close(s.transform(x_test), expected, atol=1e-4, rtol=1e-4)


def test_standardizer_imputes_missing_with_train_mean() -> None:
    x = torch.tensor([[1.0, float("nan")], [3.0, 4.0], [5.0, 8.0]])
    s = Standardizer.fit(x)
    torch.testing.assert_close(s.mean, torch.tensor([3.0, 6.0]))
    assert s.transform(x)[0, 1] == 0 and s.impute(x)[0, 1] == 6.0


def test_standardizer_statistics_by_column_blocks_equal_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """fit computes its float64 statistics over blocks of columns (bounded temporaries at bookmarks' shape): the
    same mean and std as over all columns at once, NaN ignored; transform leaves its input as it was."""
    import structtorch.inputs as inputs_module

    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 7, generator=g) * torch.arange(1.0, 8.0) + 3
    x[::5, 2] = float("nan")
    whole = Standardizer.fit(x)
    monkeypatch.setattr(inputs_module, "STATS_BLOCK_ELEMENTS", 90)  # 2 columns of 40 rows a block
    blocks = Standardizer.fit(x)
    torch.testing.assert_close(blocks.mean, whole.mean, rtol=0, atol=0)
    torch.testing.assert_close(blocks.std, whole.std, rtol=0, atol=0)
    x64 = x.double()
    torch.testing.assert_close(blocks.mean, x64.nanmean(0).float())
    torch.testing.assert_close(blocks.std, (x64 - x64.nanmean(0)).square().nanmean(0).sqrt().float())
    before = x.clone()
    z = blocks.transform(x)
    assert torch.equal(x.isnan(), before.isnan()) and torch.equal(x.nan_to_num(), before.nan_to_num())
    assert not z.isnan().any() and z[0, 2] == 0


def test_datamodule_standardises_with_train_part_only(tmp_path: Path) -> None:
    x, y = _big(60)
    root = _dataset(tmp_path, x=x, y=y, n_train=40)
    raw = MultilabelDataModule("tiny", str(root), val_fraction=0.25, seed=1, standardize=False)
    std = MultilabelDataModule("tiny", str(root), val_fraction=0.25, seed=1, standardize=True)
    xr_tr, xr_va, xr_te = raw.train_tensors[0], raw.val_tensors[0], raw.test_tensors[0]
    mean, sd = xr_tr.mean(0), xr_tr.std(0, unbiased=False)
    torch.testing.assert_close(std.train_tensors[0], (xr_tr - mean) / sd, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(std.val_tensors[0], (xr_va - mean) / sd, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(std.test_tensors[0], (xr_te - mean) / sd, atol=1e-5, rtol=1e-5)
    assert std.test_tensors[0].mean(0).abs().max() > 1e-3  # test data was not re-centred on itself


# ---------------------------------------------------------------------- datamodules
def test_train_val_and_kfold_indices() -> None:
    tr, va = train_val_indices(10, 0.3, seed=0)
    assert len(va) == 3 and sorted(tr.tolist() + va.tolist()) == list(range(10))
    assert torch.equal(va, train_val_indices(10, 0.3, seed=0)[1])
    folds = [kfold_indices(23, 5, f, seed=2) for f in range(5)]
    tests = [f[1].tolist() for f in folds]
    assert sorted(sum(tests, [])) == list(range(23))
    assert {len(t) for t in tests} <= {4, 5}
    for rest, test in folds:
        assert sorted(rest.tolist() + test.tolist()) == list(range(23))
    with pytest.raises(ValueError, match="fold"):
        kfold_indices(23, 5, 5, seed=0)


def test_multilabel_datamodule_split_is_deterministic(tmp_path: Path) -> None:
    x, y = _big(50)
    root = str(_dataset(tmp_path, x=x, y=y, n_train=40))
    kw = dict(batch_size=8, val_fraction=0.25, standardize=False)
    a = MultilabelDataModule("tiny", root, seed=5, **kw)
    b = MultilabelDataModule("tiny", root, seed=5, **kw)
    c = MultilabelDataModule("tiny", root, seed=6, **kw)
    assert a.num_features == 2 and a.num_labels == 3  # available before any Trainer
    ids = lambda dm, part: getattr(dm, f"{part}_tensors")[0][:, 0].long().tolist()  # noqa: E731
    assert ids(a, "val") == ids(b, "val") and ids(a, "val") != ids(c, "val")
    assert len(ids(a, "val")) == 10 and sorted(ids(a, "train") + ids(a, "val")) == list(range(40))
    assert ids(a, "test") == list(range(40, 50))  # the official test file
    assert a.hparams["val_fraction"] == 0.25 and a.hparams["name"] == "tiny"
    xb, yb, ib = next(iter(a.train_dataloader()))
    assert xb.shape == (8, 2) and xb.dtype == torch.float32 and yb.shape == (8, 3) and yb.dtype == torch.long
    assert ib.shape == (8,) and ib.dtype == torch.long  # example indices, for warm starts
    np.testing.assert_array_equal(a.train_tensors[1].numpy(), y[ids(a, "train")])


def test_multilabel_datamodule_kfold_partitions_train_and_test(tmp_path: Path) -> None:
    x, y = _big(53)
    root = str(_dataset(tmp_path, x=x, y=y, n_train=40))
    tests = []
    for fold in range(5):
        dm = MultilabelDataModule("tiny", root, val_fraction=0.1, seed=0, num_folds=5, fold=fold,
                                  standardize=False)
        dm.setup("fit")
        parts = [dm.train_tensors[0], dm.val_tensors[0], dm.test_tensors[0]]
        all_ids = sorted(torch.cat(parts)[:, 0].long().tolist())
        assert all_ids == list(range(53))  # train + val + test = the pooled data, no overlap
        tests += dm.test_tensors[0][:, 0].long().tolist()
    assert sorted(tests) == list(range(53))  # the test folds partition the pooled data
    with pytest.raises(ValueError, match="fold"):
        MultilabelDataModule("tiny", root, num_folds=5, fold=5)


def test_multilabel_datamodule_folds_of_the_training_file_never_see_the_test_file(tmp_path: Path) -> None:
    """fold_pool="train": the k folds partition the training file (ids 0..39); the test file (40..52) is in
    no fold, neither trained on nor held out."""
    x, y = _big(53)
    root = str(_dataset(tmp_path, x=x, y=y, n_train=40))
    held_out = []
    for fold in range(5):
        dm = MultilabelDataModule("tiny", root, val_fraction=0.0, num_folds=5, fold=fold, standardize=False,
                                  fold_pool="train")
        train, test = (sorted(t[:, 0].long().tolist()) for t in (dm.train_tensors[0], dm.test_tensors[0]))
        assert sorted(train + test) == list(range(40))
        held_out += test
    assert sorted(held_out) == list(range(40))
    with pytest.raises(ValueError, match="fold_pool"):
        MultilabelDataModule("tiny", root, num_folds=5, fold_pool="test")


def test_multilabel_datamodule_without_val(tmp_path: Path) -> None:
    root = str(_dataset(tmp_path))
    dm = MultilabelDataModule("tiny", root, val_fraction=0.0)
    assert len(dm.train_tensors[0]) == 4 and dm.val_dataloader() == []


@pytest.mark.parametrize("name", [None, "???"])
def test_multilabel_datamodule_needs_a_name(name: str | None) -> None:
    with pytest.raises(ValueError, match=r"data=mulan needs data\.name=<dataset>, one of: .*emotions.*yeast"):
        MultilabelDataModule(name)


def test_multilabel_datamodule_unknown_name_fails_at_construction(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("STRUCTTORCH_DATA", str(tmp_path))
    with pytest.raises(ValueError, match=r"unknown Mulan dataset 'emotion'. Did you mean 'emotions'"):
        MultilabelDataModule("emotion")
    assert not any(tmp_path.iterdir())  # nothing was fetched


def test_multilabel_datamodule_max_labels_and_label_attributes(tmp_path: Path) -> None:
    root = str(_dataset(tmp_path, xml=False))  # label frequencies in the train file: y0 2, y1 2, y2 3
    dm = MultilabelDataModule("tiny", root, label_attributes=3, max_labels=2, val_fraction=0.0)
    assert dm.num_labels == 2 and dm.label_names == ["y0", "y2"]
    np.testing.assert_array_equal(dm.train_tensors[1].numpy(), Y[:4][:, [0, 2]])
    np.testing.assert_array_equal(dm.test_tensors[1].numpy(), Y[4:][:, [0, 2]])
    assert dm.hparams["label_attributes"] == 3 and dm.hparams["max_labels"] == 2


def test_multilabel_datamodule_hparams_do_not_clash_with_the_learner(tmp_path: Path) -> None:
    """Lightning merges datamodule and learner hparams for the logger and fails on a shared key with two
    values (the datamodule's old ``num_labels=None`` vs the learner's ``num_labels=3``)."""
    import lightning as L

    from structtorch.learners import LEARNERS

    x, y = _big(40)
    dm = MultilabelDataModule("tiny", str(_dataset(tmp_path, x=x, y=y, n_train=30)), batch_size=10)
    learner = LEARNERS["independent"](num_features=dm.num_features, num_labels=dm.num_labels)
    assert not set(dm.hparams) & set(learner.hparams)
    trainer = L.Trainer(max_epochs=1, logger=L.pytorch.loggers.CSVLogger(tmp_path / "logs"), enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=os.fspath(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(learner, datamodule=dm)
    assert trainer.current_epoch == 1


# ---------------------------------------------------------------------- synthetic
def test_pruefer_decode_known_tree() -> None:
    g = pruefer_decode([3, 3, 3, 4], 6)
    assert g.edges.tolist() == [[0, 3], [1, 3], [2, 3], [3, 4], [4, 5]]
    assert pruefer_decode([], 2).edges.tolist() == [[0, 1]]
    assert pruefer_decode([], 1).num_edges == 0


def test_random_tree_is_a_spanning_tree_and_covers_all_labelled_trees() -> None:
    seen = set()
    for s in range(600):
        g = random_tree(4, s)
        assert g.is_tree and g.num_edges == 3
        seen.add(tuple(map(tuple, g.edges.tolist())))
    assert len(seen) == 16  # Cayley: 4 ** 2 labelled trees


def test_crank_synthetic_labels_are_exact_map() -> None:
    d = crank_synthetic(30, 20, num_labels=7, num_features=4, seed=1)
    assert d.x_train.shape == (30, 4) and d.y_train.shape == (30, 7) and d.y_test.shape == (20, 7)
    assert d.y_train.dtype == torch.long and isinstance(d.tree, Graph) and d.tree.is_tree
    assert d.unary_weights.shape == (7, 4) and d.pairwise_weights.shape == (6,)
    for x, y in ((d.x_train, d.y_train), (d.x_test, d.y_test)):
        _, y_bf = brute_force_map(d.potentials(x))
        assert torch.equal(y_bf, y)
    # the energy really is sum_i y_i w_i^T x + sum_(ij in T) w_ij y_i y_j
    y = d.y_test[0]
    e = d.tree.edges
    energy = (y.double() * (d.unary_weights @ d.x_test[0].double())).sum() + (
        d.pairwise_weights * (y[e[:, 0]] * y[e[:, 1]]).double()).sum()
    torch.testing.assert_close(d.potentials(d.x_test[:1]).score(y[None])[0], energy)


def test_crank_synthetic_is_seeded_and_nested() -> None:
    small, big = crank_synthetic(10, 25, seed=3), crank_synthetic(40, 25, seed=3)
    assert small.tree == big.tree and torch.equal(small.pairwise_weights, big.pairwise_weights)
    assert torch.equal(small.x_test, big.x_test) and torch.equal(small.y_test, big.y_test)
    assert torch.equal(small.x_train, big.x_train[:10])
    other = crank_synthetic(10, 25, seed=4)
    assert not torch.equal(other.x_test, small.x_test)
    mask = big.tree_edge_mask()
    assert mask.sum() == 9 and (big.complete_graph_weights()[~mask] == 0).all()
    torch.testing.assert_close(big.complete_graph_weights()[mask].sort().values, big.pairwise_weights.sort().values)


def test_crank_synthetic_pairwise_mean_makes_every_tree_edge_an_exclusion() -> None:
    """pairwise_mean shifts the edge weights and changes no other draw (the default is the paper's data); with
    pairwise_scale=0 and a strongly negative mean, two tree neighbours are never both 1 (the labels are a
    maximum-weight independent set of the tree) while every label is still on for some inputs."""
    plain, shifted = crank_synthetic(50, 400, num_labels=6, seed=3), crank_synthetic(50, 400, num_labels=6, seed=3,
                                                                                      pairwise_mean=0.0)
    assert torch.equal(plain.y_test, shifted.y_test) and torch.equal(plain.pairwise_weights, shifted.pairwise_weights)
    d = crank_synthetic(50, 400, num_labels=6, seed=3, pairwise_scale=0.0, pairwise_mean=-8.0)
    assert d.tree == plain.tree and torch.equal(d.x_test, plain.x_test)
    assert torch.equal(d.unary_weights, plain.unary_weights) and (d.pairwise_weights == -8.0).all()
    e = d.tree.edges
    assert not (d.y_test[:, e[:, 0]] & d.y_test[:, e[:, 1]]).any() and d.y_test.any(0).all()
    assert not torch.equal(d.y_test, plain.y_test)
    torch.testing.assert_close(crank_synthetic(5, 5, seed=1, pairwise_mean=1.5).pairwise_weights,
                               crank_synthetic(5, 5, seed=1).pairwise_weights + 1.5)
    dm = SyntheticDataModule(num_train=50, num_test=400, num_labels=6, seed=3, pairwise_scale=0.0, pairwise_mean=-8.0)
    assert torch.equal(dm.test_tensors[1], d.y_test) and dm.hparams["pairwise_mean"] == -8.0
    for bad in (float("nan"), float("inf"), "big", True):
        with pytest.raises(ValueError, match="pairwise_mean"):
            crank_synthetic(5, 5, pairwise_mean=bad)


def test_synthetic_datamodule_interface() -> None:
    dm = SyntheticDataModule(num_train=50, num_test=30, num_labels=5, batch_size=16, val_fraction=0.2, seed=2)
    assert dm.num_features == 4 and dm.num_labels == 5
    assert [len(dm.train_tensors[0]), len(dm.val_tensors[0]), len(dm.test_tensors[0])] == [40, 10, 30]
    assert dm.dataset.tree.is_tree
    x, y, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 4) and y.shape == (16, 5) and y.dtype == torch.long
    assert len(next(iter(dm.test_dataloader()))[0]) == 16
    assert dm.hparams["num_train"] == 50


def test_synthetic_datamodule_runs_in_a_trainer(tmp_path: Path) -> None:
    import lightning as L

    class Probe(L.LightningModule):
        def __init__(self, d: int, n: int) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(d, n)

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            x, y = batch[0], batch[1]
            return torch.nn.functional.binary_cross_entropy_with_logits(self.lin(x), y.float())

        def validation_step(self, batch, batch_idx) -> None:  # noqa: ANN001
            self.log("val/loss", self.training_step(batch, batch_idx))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = SyntheticDataModule(num_train=64, num_test=16, batch_size=16)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=os.fspath(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Probe(dm.num_features, dm.num_labels), datamodule=dm)
    assert "val/loss" in trainer.callback_metrics


def test_max_rows_keeps_a_seeded_subset_of_the_training_file():
    """data.max_rows: that many rows of the training file, the same ones for the same seed, in file order; the
    test file is untouched; a bad value is a clear error."""
    x, y, _, _ = cached_mulan("emotions", "train")
    dm = MultilabelDataModule(name="emotions", max_rows=100, val_fraction=0.0, standardize=False)
    dm.setup()
    sub_x, sub_y = dm.train_tensors
    assert sub_x.shape == (100, x.shape[1]) and sub_y.shape == (100, y.shape[1])
    rows = [int(torch.nonzero((x == r).all(1))[0]) for r in sub_x]
    assert rows == sorted(rows) and len(set(rows)) == 100 and torch.equal(y[rows], sub_y)
    again = MultilabelDataModule(name="emotions", max_rows=100, val_fraction=0.0, standardize=False)
    again.setup()
    assert torch.equal(again.train_tensors[0], sub_x)
    assert len(dm.test_tensors[0]) == len(cached_mulan("emotions", "test")[0])
    with pytest.raises(ValueError, match="data.max_rows"):
        MultilabelDataModule(name="emotions", max_rows=0)
