"""StructuredLearner: the LightningModule every learner subclasses.

A learner supplies an energy (``build_energy``); the base class brings the loss (structured
hinge with Hamming margin rescaling, or CRF likelihood), the training inference (the
loss-augmented max), the test inference (prediction), l2 regularisation, optimizers,
metrics and logging.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import lightning as L
import torch

from ..energies import Energy
from ..inference import tree_map
from ..losses import crf_nll, map_value, structured_hinge
from ..metrics import multilabel_metrics
from ..potentials import Potentials

__all__ = ["StructuredLearner", "TRAIN_INFERENCE", "TEST_INFERENCE"]

#: name -> loss-augmented max value [*B] of Potentials (the max inside the structured hinge)
TRAIN_INFERENCE: dict[str, Callable[[Potentials], torch.Tensor]] = {"tree_map": map_value}
#: name -> predicted assignment [*B, n] of Potentials
TEST_INFERENCE: dict[str, Callable[[Potentials], torch.Tensor]] = {"tree_map": lambda pot: tree_map(pot)[1]}


class StructuredLearner(L.LightningModule):
    """Base learner. Batches are ``(x [B, D] float, y [B, n] long[, index [B] long])``.

    Args:
        num_features, num_labels: input and output sizes (D, n).
        energy: an ``Energy`` to train; None calls ``build_energy()`` (what subclasses implement).
        loss: "hinge" (M3N, Hamming margin rescaling) or "crf" (negative log-likelihood, trees).
        train_inference / test_inference: names in TRAIN_INFERENCE / TEST_INFERENCE, or callables.
        l2: lambda of the lambda/2 ||w||^2 regulariser (added to the mean loss).
        optimizer: "adam", "adamw" or "sgd"; lr; lr_schedule "cosine" or "none".
        margin_scale: weight of the Hamming term in the hinge.
    """

    def __init__(
        self,
        num_features: int,
        num_labels: int,
        energy: Energy | None = None,
        loss: str = "hinge",
        train_inference: str | Callable = "tree_map",
        test_inference: str | Callable = "tree_map",
        l2: float = 0.1,
        optimizer: str = "adam",
        lr: float = 0.01,
        lr_schedule: str = "cosine",
        margin_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if loss not in ("hinge", "crf"):
            raise ValueError(f"loss must be 'hinge' or 'crf', got {loss!r}")
        if optimizer not in ("adam", "adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adam', 'adamw' or 'sgd', got {optimizer!r}")
        self.save_hyperparameters(ignore=["energy"])
        self.energy = energy if energy is not None else self.build_energy()
        self._train_max = _lookup(train_inference, TRAIN_INFERENCE, "train_inference")
        self._predict = _lookup(test_inference, TEST_INFERENCE, "test_inference")
        self.val_metrics = multilabel_metrics("val/", num_labels)
        self.test_metrics = multilabel_metrics("test/", num_labels)

    # ------------------------------------------------------------------ what subclasses supply
    def build_energy(self) -> Energy:
        """The energy of this learner (subclasses override, or pass ``energy=``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_energy() or be given energy=")

    def loss(self, pot: Potentials, y: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Per-example training loss [B]; ``index`` [B] identifies the training examples (warm starts)."""
        if self.hparams.loss == "crf":
            return crf_nll(pot, y)
        return structured_hinge(pot, y, self._train_max, self.hparams.margin_scale)

    def regularizer(self) -> torch.Tensor:
        """lambda/2 ||w||^2 over the energy's weights (biases excluded)."""
        sq = sum((p.pow(2).sum() for n, p in self.energy.named_parameters() if not n.endswith("bias")),
                 torch.zeros((), device=self.device))
        return 0.5 * self.hparams.l2 * sq

    # ------------------------------------------------------------------ prediction
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted labels y_hat [B, n] for inputs x [B, D]."""
        return self._predict(self.energy(x))

    # ------------------------------------------------------------------ Lightning hooks
    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        x, y = batch[0], batch[1]
        data_loss = self.loss(self.energy(x), y, batch[2] if len(batch) > 2 else None).mean()
        total = data_loss + self.regularizer()
        self.log("train/loss", data_loss, prog_bar=True, on_step=False, on_epoch=True, batch_size=len(x),
                 sync_dist=True)
        self.log("train/objective", total, on_step=False, on_epoch=True, batch_size=len(x), sync_dist=True)
        return total

    def _evaluate(self, batch: tuple[torch.Tensor, ...], metrics) -> None:
        x, y = batch[0], batch[1]
        metrics.update(self(x), y)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(x))

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def test_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x)

    def configure_optimizers(self):
        hp = self.hparams
        opt_cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[hp.optimizer]
        opt = opt_cls(self.parameters(), lr=hp.lr)
        if hp.lr_schedule == "none" or self.trainer is None or not self.trainer.max_epochs:
            return opt
        # closed-form cosine over the *current* max_epochs (a run resumed with more epochs keeps annealing to 0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: self._cosine(epoch))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}

    def _cosine(self, epoch: int) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * min(epoch, self.trainer.max_epochs) / max(1, self.trainer.max_epochs)))


def _lookup(what: str | Callable, registry: dict[str, Callable], name: str) -> Callable:
    if callable(what):
        return what
    if what not in registry:
        raise ValueError(f"{name} must be one of {sorted(registry)} or a callable, got {what!r}")
    return registry[what]
