"""Minibatch gradient steps (Adam, AdamW, SGD) on the learner's loss + regulariser, for ``max_epochs``: the
strategy of non-convex energies, through Lightning's automatic optimisation."""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import Strategy

__all__ = ["Gradient", "OPTIMIZERS"]

#: model.solver values of the gradient strategy
OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


class Gradient(Strategy):
    """``OPTIMIZERS[name]`` with step ``lr``, annealed by a cosine over ``max_epochs`` (lr_schedule="cosine")."""

    automatic = True

    def __init__(self, learner, name: str) -> None:
        super().__init__(learner)
        self.name = name

    def check(self) -> None:
        if self.learner.num_models is not None:
            raise ValueError(f"model.l2 as a list (a regularisation grid) needs solver=lbfgs or bcfw, "
                             f"got solver={self.name}")

    def configure_optimizers(self) -> Any:
        hp, trainer = self.learner.hparams, self.learner.trainer
        opt = OPTIMIZERS[self.name](self.learner.parameters(), lr=hp.lr)
        if hp.lr_schedule == "none" or not trainer.max_epochs:
            return opt
        # closed-form cosine over the *current* max_epochs (a run resumed with more epochs keeps annealing to 0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: cosine(epoch, trainer.max_epochs))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        learner = self.learner
        x, y = batch[0], learner.energy_labels(batch[1])
        data_loss = learner.loss(learner.energy(x), y, batch[2] if len(batch) > 2 else None).mean()
        total = data_loss + learner.regularizer()
        learner.log("train/loss", data_loss, prog_bar=True, on_step=False, on_epoch=True, batch_size=len(x),
                    sync_dist=True)
        learner.log("train/objective", total, on_step=False, on_epoch=True, batch_size=len(x), sync_dist=True)
        return total


def cosine(epoch: int, max_epochs: int) -> float:
    """The cosine factor of the learning rate at ``epoch`` of ``max_epochs``: 1 at the start, 0 at the end."""
    return 0.5 * (1.0 + math.cos(math.pi * min(epoch, max_epochs) / max(1, max_epochs)))
