"""Multi-label metrics against hand-computed values and a loop reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from structtorch import Graph
from structtorch.metrics import (
    ExampleF1,
    HammingAccuracy,
    MacroF1,
    MicroF1,
    SubsetAccuracy,
    edge_recovery,
    example_scores,
    multilabel_metrics,
    multilabel_scores,
    selection_scores,
)

KEYS = ("hamming_acc", "subset_acc", "example_f1", "micro_f1", "macro_f1")
P = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 0], [0, 1, 0]])
T = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 0], [0, 0, 1]])
# by hand: Hamming 1 + 3 + 3 + 1 = 8 / 12 right; subset: rows 2, 3 -> 2 / 4;
# example F1: row 1 tp=1, |y|=2, |y_hat|=2 -> 1/2; row 2 both empty -> 1; row 3 -> 1; row 4 tp=0 -> 0: 2.5 / 4
# micro: tp 3, fp 2, fn 2 -> 6 / 10; macro: label 0 (tp 2) 1, label 1 (tp 1, fp 1, fn 1) 1/2,
#   label 2 (fp 1, fn 1) 0 -> 1/2
EXPECTED = {"hamming_acc": 8 / 12, "subset_acc": 2 / 4, "example_f1": 2.5 / 4, "micro_f1": 0.6,
            "macro_f1": 0.5}


def test_example_scores_are_each_rows_metric_by_hand():
    """Per row (the comment above): Hamming 1/3, 1, 1, 1/3; subset 0, 1, 1, 0; F1 1/2, 1, 1, 0. Their means are the
    metrics' values (what a CV of lambda averages)."""
    by_row = {"hamming_acc": [1 / 3, 1, 1, 1 / 3], "subset_acc": [0, 1, 1, 0], "example_f1": [0.5, 1, 1, 0]}
    for name, rows in by_row.items():
        scores = example_scores(name, P, T)
        assert scores.dtype == torch.float64 and scores.tolist() == pytest.approx(rows)
        assert float(scores.mean()) == pytest.approx(EXPECTED[name])
    with pytest.raises(ValueError, match="name must be one of"):
        example_scores("micro_f1", P, T)
    selected = selection_scores(P, T)  # subset + F1 per row: what the learners' held-out choices score by
    assert selected.dtype == torch.float64 and selected.tolist() == pytest.approx([0.5, 2, 2, 0])


def _reference(p: np.ndarray, t: np.ndarray) -> dict[str, float]:
    """Loop implementation of the documented conventions (0/0 -> 1)."""
    def f1(tp: float, fp: float, fn: float) -> float:
        return 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)

    ex = [f1(int((pi & ti).sum()), int((pi & ~ti).sum()), int((~pi & ti).sum())) for pi, ti in zip(p, t)]
    per_label = [f1(int((p[:, j] & t[:, j]).sum()), int((p[:, j] & ~t[:, j]).sum()),
                    int((~p[:, j] & t[:, j]).sum())) for j in range(p.shape[1])]
    return {"hamming_acc": float((p == t).mean()), "subset_acc": float((p == t).all(1).mean()),
            "example_f1": float(np.mean(ex)),
            "micro_f1": f1(int((p & t).sum()), int((p & ~t).sum()), int((~p & t).sum())),
            "macro_f1": float(np.mean(per_label))}


def _values(coll, prefix: str = "") -> dict[str, float]:  # noqa: ANN001
    return {k[len(prefix):]: float(v) for k, v in coll.compute().items()}


def test_hand_computed_values() -> None:
    coll = multilabel_metrics()
    coll.update(P, T)
    got = _values(coll)
    assert set(got) == set(KEYS)
    for k in KEYS:
        assert got[k] == pytest.approx(EXPECTED[k], abs=1e-6), k


def test_multilabel_scores_are_the_collection_values() -> None:
    got = multilabel_scores(P, T)
    assert set(got) == set(KEYS) and all(isinstance(v, float) for v in got.values())
    assert got == pytest.approx(EXPECTED, abs=1e-6)
    g = torch.Generator().manual_seed(1)
    p, t = torch.rand(30, 5, generator=g) < 0.4, torch.rand(30, 5, generator=g) < 0.4
    coll = multilabel_metrics(num_labels=5)
    coll.update(p, t)
    assert multilabel_scores(p, t) == _values(coll)


def test_individual_metric_classes() -> None:
    for cls, key in ((HammingAccuracy, "hamming_acc"), (SubsetAccuracy, "subset_acc"),
                     (ExampleF1, "example_f1"), (MicroF1, "micro_f1"), (MacroF1, "macro_f1")):
        m = cls()
        assert float(m(P, T)) == pytest.approx(EXPECTED[key], abs=1e-6), key
        m.reset()
        m(P[:1], T[:1])  # forward: batch value + accumulation
        m(P[1:], T[1:])
        assert float(m.compute()) == pytest.approx(EXPECTED[key], abs=1e-6), key


def test_prefix_keys() -> None:
    coll = multilabel_metrics("test/", num_labels=3)
    coll.update(P, T)
    assert set(coll.compute()) == {f"test/{k}" for k in KEYS}


def test_all_empty_label_sets_are_perfect() -> None:
    z = torch.zeros(5, 4, dtype=torch.long)
    coll = multilabel_metrics()
    coll.update(z, z)
    assert all(v == 1.0 for v in _values(coll).values())


def test_empty_predictions_on_nonempty_targets() -> None:
    t = torch.tensor([[1, 0], [0, 0]])
    coll = multilabel_metrics()
    coll.update(torch.zeros_like(t), t)
    got = _values(coll)
    assert got["example_f1"] == pytest.approx(0.5)  # row 1: 0, row 2: both empty -> 1
    assert got["micro_f1"] == 0.0
    assert got["macro_f1"] == pytest.approx(0.5)  # label 0: 0, label 1: never true/predicted -> 1
    assert got["hamming_acc"] == pytest.approx(3 / 4) and got["subset_acc"] == pytest.approx(0.5)


def test_zero_division_option() -> None:
    z = torch.zeros(2, 3, dtype=torch.long)
    assert float(ExampleF1(zero_division=0.0)(z, z)) == 0.0
    assert float(MicroF1(zero_division=0.0)(z, z)) == 0.0
    assert float(MacroF1(zero_division=0.0)(z, z)) == 0.0


def test_accumulates_over_updates_like_one_big_batch() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.randint(0, 2, (37, 6), generator=g)
    t = torch.randint(0, 2, (37, 6), generator=g)
    t[:5] = 0
    p[:3] = 0  # some examples with both label sets empty
    coll = multilabel_metrics(num_labels=6)
    for chunk in (slice(0, 10), slice(10, 11), slice(11, 30), slice(30, 37)):
        coll.update(p[chunk], t[chunk])
    ref = _reference(p.numpy().astype(bool), t.numpy().astype(bool))
    got = _values(coll)
    for k in KEYS:
        assert got[k] == pytest.approx(ref[k], abs=1e-6), k
    one = multilabel_metrics(num_labels=6)
    one.update(p, t)
    assert _values(one) == pytest.approx(got, abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_random_against_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    B, L = int(torch.randint(1, 20, (1,), generator=g)), int(torch.randint(1, 8, (1,), generator=g))
    p = torch.rand(B, L, generator=g) < 0.3
    t = torch.rand(B, L, generator=g) < 0.3
    coll = multilabel_metrics()
    coll.update(p, t)  # bool inputs
    ref = _reference(p.numpy(), t.numpy())
    got = _values(coll)
    for k in KEYS:
        assert got[k] == pytest.approx(ref[k], abs=1e-6), k
        assert 0.0 <= got[k] <= 1.0


def test_reset() -> None:
    m = HammingAccuracy()
    m.update(torch.ones(2, 2), torch.zeros(2, 2))
    m.reset()
    m.update(torch.ones(2, 2), torch.ones(2, 2))
    assert float(m.compute()) == 1.0
    mac = MacroF1()
    mac.update(torch.ones(2, 2), torch.ones(2, 2))
    mac.reset()
    mac.update(torch.ones(1, 3), torch.zeros(1, 3))  # lazily sized again after reset
    assert float(mac.compute()) == 0.0


def test_float_zero_one_inputs_accepted() -> None:
    assert float(SubsetAccuracy()(P.float(), T.double())) == pytest.approx(0.5)


def test_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"preds \(4, 3\).*target \(4, 2\)"):
        HammingAccuracy().update(P, T[:, :2])
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        ExampleF1().update(P[0], T[0])


def test_non_binary_values_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="preds must be binary"):
        MicroF1().update(P * 2, T)
    with pytest.raises(ValueError, match="target must be binary"):
        SubsetAccuracy().update(P, T - 1)
    with pytest.raises(ValueError, match="binary"):
        MacroF1().update(torch.full((2, 3), 0.7), T[:2])


def test_macro_f1_label_count_is_fixed() -> None:
    m = MacroF1(num_labels=3)
    with pytest.raises(ValueError, match="3 labels"):
        m.update(torch.ones(2, 4), torch.ones(2, 4))


def test_edge_recovery() -> None:
    true = Graph(4, [[0, 1], [1, 2], [2, 3]])
    pred = Graph(4, [[1, 0], [1, 3], [3, 2]])
    r = edge_recovery(pred, true)
    assert r["precision"] == pytest.approx(2 / 3) and r["recall"] == pytest.approx(2 / 3)
    assert r["f1"] == pytest.approx(2 / 3)
    mask = torch.tensor([True, False, True])
    assert edge_recovery(mask, torch.tensor([True, True, False]))["recall"] == pytest.approx(0.5)
    with pytest.raises(TypeError):
        edge_recovery(pred, mask)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_metrics_on_cuda() -> None:
    coll = multilabel_metrics("val/").to("cuda")
    coll.update(P.cuda(), T.cuda())
    got = _values(coll, "val/")
    for k in KEYS:
        assert got[k] == pytest.approx(EXPECTED[k], abs=1e-6), k
