"""Multi-label metrics as torchmetrics ``Metric``s (sum-reduced states: DDP-safe), ``multilabel_scores`` (the same
metrics of one batch, as floats), plus edge recovery.

Every metric takes ``preds`` and ``target`` of shape [B, L] with values in {0, 1} (any integer,
bool, or float dtype holding exactly 0/1) and returns a value in [0, 1].

Conventions when a ratio is 0/0 (the Mulan / Meshi et al. convention, configurable with
``zero_division``, default 1.0): an example whose true and predicted label sets are both empty
has example-F1 1 (nothing to get wrong); micro-F1 with no positive and no predicted label at all
is 1; in macro-F1 a label with no positive and no prediction in the whole evaluation set
(tp + fp + fn = 0) has F1 1. Otherwise F1 = 2 tp / (2 tp + fp + fn).
"""

from __future__ import annotations

import torch
from torchmetrics import Metric, MetricCollection
from torchmetrics.utilities import dim_zero_cat

from .graph import Graph

__all__ = ["ExampleCounts", "ExampleF1", "HammingAccuracy", "MacroF1", "MicroF1", "PerLabelCounts", "SubsetAccuracy",
           "EXAMPLE_METRICS", "SELECTION_METRICS", "edge_recovery", "example_scores", "multilabel_metrics",
           "multilabel_scores", "segmentation_scores", "selection_scores"]

#: the metrics that score each example on its own (``example_scores``): their values are the means over examples
EXAMPLE_METRICS = ("hamming_acc", "subset_acc", "example_f1")
#: what the learners' held-out choices score by (RTA's feature map and interactions: their sum; TreeCRF's decoder)
SELECTION_METRICS = ("subset_acc", "example_f1")


def _check(preds: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate preds / target [B, L] in {0, 1}; return them as bool tensors."""
    for name, t in (("preds", preds), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape [B, L], got {type(t).__name__}")
    if preds.shape != target.shape or preds.dim() != 2:
        raise ValueError(f"preds and target must both have shape [B, L], got preds {tuple(preds.shape)} "
                         f"and target {tuple(target.shape)}")
    out = []
    for name, t in (("preds", preds), ("target", target)):
        if t.dtype != torch.bool and t.numel() and ((t != 0) & (t != 1)).any():
            raise ValueError(f"{name} must be binary (values in {{0, 1}}), got values "
                             f"{torch.unique(t)[:10].tolist()}; threshold scores or probabilities first")
        out.append(t.bool())
    return out[0], out[1]


def _f1(tp: torch.Tensor, fp: torch.Tensor, fn: torch.Tensor, zero_division: float) -> torch.Tensor:
    """2 tp / (2 tp + fp + fn), elementwise; ``zero_division`` where the denominator is 0."""
    tp, fp, fn = tp.double(), fp.double(), fn.double()
    denom = 2 * tp + fp + fn
    return torch.where(denom > 0, 2 * tp / denom.clamp(min=1), torch.full_like(denom, zero_division))


def example_scores(name: str, preds: torch.Tensor, target: torch.Tensor, zero_division: float = 1.0) -> torch.Tensor:
    """Each example's ``name`` (one of ``EXAMPLE_METRICS``) [B] (float64) from preds, target [B, L] in {0, 1}: the
    fraction of its labels right, whether all of them are, or its F1 (``ExampleF1``; ``zero_division`` when both
    label sets are empty)."""
    p, t = _check(preds, target)
    if name == "hamming_acc":
        return (p == t).double().mean(-1)
    if name == "subset_acc":
        return (p == t).all(-1).double()
    if name == "example_f1":
        return _f1((p & t).sum(-1), (p & ~t).sum(-1), (~p & t).sum(-1), zero_division)
    raise ValueError(f"example_scores: name must be one of {EXAMPLE_METRICS}, got {name!r}")


def selection_scores(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Each example's summed ``SELECTION_METRICS`` [B] (float64: subset accuracy + example F1, in [0, 2]) from preds,
    target [B, L] in {0, 1}."""
    return sum(example_scores(m, preds, target) for m in SELECTION_METRICS)


class _MultilabelMetric(Metric):
    is_differentiable = False
    higher_is_better = True
    full_state_update = False


class _CountRatio(_MultilabelMetric):
    """correct / total, both summed across batches and processes; subclasses count them."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("correct", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _count(self, p: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, int]:
        raise NotImplementedError

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """preds, target: [B, L] in {0, 1}."""
        correct, total = self._count(*_check(preds, target))
        self.correct += correct
        self.total += total

    def compute(self) -> torch.Tensor:
        return (self.correct.double() / self.total.clamp(min=1)).float()


class HammingAccuracy(_CountRatio):
    """Fraction of correctly predicted labels over all examples and labels (1 - Hamming loss)."""

    def _count(self, p: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, int]:
        return (p == t).sum(), t.numel()


class SubsetAccuracy(_CountRatio):
    """Fraction of examples whose whole label vector is right (0/1 accuracy, exact match)."""

    def _count(self, p: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, int]:
        return (p == t).all(-1).sum(), t.shape[0]


class ExampleF1(_MultilabelMetric):
    """Example-based F1: the mean over examples of 2 |y & y_hat| / (|y| + |y_hat|).

    An example with both label sets empty scores ``zero_division`` (default 1, the Mulan / Meshi
    et al. convention).
    """

    def __init__(self, zero_division: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.zero_division = float(zero_division)
        self.add_state("f1_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """preds, target: [B, L] in {0, 1}."""
        f1 = example_scores("example_f1", preds, target, self.zero_division)
        self.f1_sum += f1.sum().to(self.f1_sum.dtype)
        self.total += target.shape[0]

    def compute(self) -> torch.Tensor:
        return (self.f1_sum / self.total.clamp(min=1)).float()


class MicroF1(_MultilabelMetric):
    """F1 of the pooled true/false positive/negative counts over all examples and labels.

    ``zero_division`` (default 1) when there is no positive and no predicted label at all.
    """

    def __init__(self, zero_division: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.zero_division = float(zero_division)
        for name in ("tp", "fp", "fn"):
            self.add_state(name, default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """preds, target: [B, L] in {0, 1}."""
        p, t = _check(preds, target)
        self.tp += (p & t).sum()
        self.fp += (p & ~t).sum()
        self.fn += (~p & t).sum()

    def compute(self) -> torch.Tensor:
        return _f1(self.tp, self.fp, self.fn, self.zero_division).float()


class MacroF1(_MultilabelMetric):
    """Mean over labels of the per-label F1 (counts pooled over all examples).

    A label with tp + fp + fn = 0 (never true, never predicted) scores ``zero_division``
    (default 1). Pass ``num_labels`` to allocate the [L] count states up front (recommended under
    DDP); without it they are sized at the first ``update``.
    """

    def __init__(self, num_labels: int | None = None, zero_division: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.zero_division = float(zero_division)
        self.num_labels = num_labels
        size = 0 if num_labels is None else int(num_labels)
        for name in ("tp", "fp", "fn"):
            self.add_state(name, default=torch.zeros(size, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """preds, target: [B, L] in {0, 1}; L must stay the same across updates."""
        p, t = _check(preds, target)
        L = t.shape[1]
        if self.num_labels is None and self.tp.numel() == 0:
            self.tp, self.fp, self.fn = (torch.zeros(L, dtype=torch.long, device=t.device) for _ in range(3))
        if self.tp.numel() != L:
            raise ValueError(f"MacroF1 expects {self.tp.numel()} labels, got preds of shape {tuple(p.shape)}")
        for name, count in zip(("tp", "fp", "fn"), _confusion(p, t, 0).unbind(-1)):
            getattr(self, name).add_(count)

    def _reduce_states(self, incoming_state: dict) -> None:
        """Merge (used by ``forward`` and ``merge_state``), sizing lazily allocated [0] states."""
        incoming_state = dict(incoming_state)
        for name in ("tp", "fp", "fn"):
            mine, theirs = getattr(self, name), incoming_state[name]
            if theirs.numel() == 0 and mine.numel():
                incoming_state[name] = torch.zeros_like(mine)
            elif mine.numel() == 0 and theirs.numel():
                setattr(self, name, torch.zeros_like(theirs))
        super()._reduce_states(incoming_state)

    def compute(self) -> torch.Tensor:
        if self.tp.numel() == 0:
            return torch.tensor(self.zero_division, device=self.tp.device)
        return _f1(self.tp, self.fp, self.fn, self.zero_division).mean().float()


def _confusion(p: torch.Tensor, t: torch.Tensor, dim: int) -> torch.Tensor:
    """Confusion counts of boolean predictions p and targets t [B, L] summed over ``dim`` (0: per label, -1: per
    example), stacked last: [..., 4] long (tp, fp, fn, tn)."""
    return torch.stack([(p & t).sum(dim), (p & ~t).sum(dim), (~p & t).sum(dim), (~p & ~t).sum(dim)], -1)


class PerLabelCounts(_MultilabelMetric):
    """Per-label accuracy and F1 (counts pooled over examples and processes), for per-label reports.

    ``compute()`` returns ``{"accuracy": [L], "f1": [L], "support": [L]}`` (support = number of positives);
    F1 of a label never true nor predicted is ``zero_division``.
    """

    def __init__(self, num_labels: int, zero_division: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.zero_division = float(zero_division)
        for name in ("tp", "fp", "fn", "tn"):
            self.add_state(name, default=torch.zeros(int(num_labels), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """preds, target: [B, L] in {0, 1}."""
        p, t = _check(preds, target)
        if t.shape[1] != self.tp.numel():
            raise ValueError(f"PerLabelCounts expects {self.tp.numel()} labels, got preds of shape {tuple(p.shape)}")
        for name, count in zip(("tp", "fp", "fn", "tn"), _confusion(p, t, 0).unbind(-1)):
            getattr(self, name).add_(count)

    def compute(self) -> dict[str, torch.Tensor]:
        total = (self.tp + self.fp + self.fn + self.tn).clamp(min=1).double()
        return {"accuracy": ((self.tp + self.tn) / total).float(),
                "f1": _f1(self.tp, self.fp, self.fn, self.zero_division).float(),
                "support": self.tp + self.fn}


class ExampleCounts(_MultilabelMetric):
    """Every example's confusion counts, for per-example (per-image) reports: ``compute()`` returns [N, 4] long
    (tp, fp, fn, tn of each example's labels), gathered from all processes (in an order that may differ from the
    data's)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("counts", default=[], dist_reduce_fx="cat")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """preds, target: [B, L] in {0, 1}."""
        p, t = _check(preds, target)
        self.counts.append(_confusion(p, t, -1))

    def compute(self) -> torch.Tensor:
        # a list of [B, 4] here, one [N, 4] tensor once synced across processes
        return dim_zero_cat(self.counts) if len(self.counts) else torch.zeros(0, 4, dtype=torch.long)


def segmentation_scores(counts: torch.Tensor, zero_division: float = 1.0) -> dict[str, float]:
    """Figure/ground scores of per-image confusion counts [N, 4] (``ExampleCounts``; label 1 = figure), in [0, 1]:

    ``pixel_error`` (all pixels pooled: Domke's univariate error), ``iou`` (intersection over union of the figure,
    pooled: tp / (tp + fp + fn)), ``image_iou`` (the mean over images of each image's IoU; ``zero_division`` for an
    image with no figure, true or predicted), and ``image_error`` / ``image_error_median`` / ``image_error_max``
    (the mean, median (the lower middle one for an even N) and largest per-image error; the mean equals pixel_error
    when all images have as many pixels).
    """
    if counts.dim() != 2 or counts.shape[1] != 4 or not len(counts):
        raise ValueError(f"counts must be [N >= 1, 4] (tp, fp, fn, tn per image), got {tuple(counts.shape)}")
    c = counts.double()
    tp, fp, fn, tn = c.unbind(-1)
    errors = (fp + fn) / c.sum(-1)
    union = tp + fp + fn
    image_iou = torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(union, zero_division))
    iou = float(tp.sum() / union.sum()) if union.sum() else zero_division
    return {"pixel_error": float((fp + fn).sum() / c.sum()), "iou": iou,
            "image_iou": float(image_iou.mean()), "image_error": float(errors.mean()),
            "image_error_median": float(errors.median()), "image_error_max": float(errors.max())}


def multilabel_metrics(prefix: str = "", num_labels: int | None = None) -> MetricCollection:
    """The standard set, keyed ``<prefix>hamming_acc``, ``subset_acc``, ``example_f1``, ``micro_f1``,
    ``macro_f1`` (e.g. prefix ``"test/"``). Call it once per stage (train / val / test)."""
    return MetricCollection({
        "hamming_acc": HammingAccuracy(),
        "subset_acc": SubsetAccuracy(),
        "example_f1": ExampleF1(),
        "micro_f1": MicroF1(),
        "macro_f1": MacroF1(num_labels=num_labels),
    }, prefix=prefix)


def multilabel_scores(preds: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """``multilabel_metrics`` of one [B, L] pair of predictions and targets, as floats keyed ``hamming_acc``, ...:
    the same metrics outside Lightning (e.g. for a scikit-learn baseline)."""
    metrics = multilabel_metrics(num_labels=target.shape[-1])
    metrics.update(preds, target)
    return {k: float(v) for k, v in metrics.compute().items()}


def edge_recovery(predicted: Graph | torch.Tensor, true: Graph | torch.Tensor) -> dict[str, float]:
    """Structure recovery of a learned graph against the true one (e.g. the synthetic CRANK tree).

    Both are ``Graph``s on the same nodes, or bool edge masks [E] over one common edge list (e.g.
    ``Graph.complete(n)``). Returns ``precision`` (fraction of predicted edges that are true),
    ``recall`` (fraction of true edges recovered) and ``f1``; 1.0 for a 0/0 ratio.
    """
    if isinstance(predicted, Graph) != isinstance(true, Graph):
        raise TypeError("edge_recovery expects two Graphs or two bool masks [E], not one of each")
    if isinstance(predicted, Graph) and predicted.num_nodes != true.num_nodes:
        raise ValueError(f"graphs on different node counts: {predicted.num_nodes} and {true.num_nodes}")
    if not isinstance(predicted, Graph) and predicted.shape != true.shape:
        raise ValueError(f"edge masks of different shapes: {tuple(predicted.shape)} and {tuple(true.shape)}")
    pred_set, true_set = _edge_set(predicted), _edge_set(true)
    tp = len(pred_set & true_set)
    precision = tp / len(pred_set) if pred_set else 1.0
    recall = tp / len(true_set) if true_set else 1.0
    denom = len(pred_set) + len(true_set)
    return {"precision": precision, "recall": recall, "f1": 2 * tp / denom if denom else 1.0}


def _edge_set(g: Graph | torch.Tensor) -> set:
    if isinstance(g, Graph):
        if g.is_ensemble:
            raise ValueError("edge_recovery expects a single graph, got an ensemble")
        return {(min(a, b), max(a, b)) for a, b in g.edges.tolist()}
    if not isinstance(g, torch.Tensor) or g.dim() != 1:
        raise ValueError(f"edge_recovery expects a Graph or a bool mask [E], got {type(g).__name__}")
    return set(torch.as_tensor(g).bool().nonzero().squeeze(1).tolist())
