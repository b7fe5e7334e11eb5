"""The training-strategy protocol: how a learner's parameters are fitted, behind one interface that
``StructuredLearner`` drives from Lightning's hooks.

A strategy is built by the learner (``StructuredLearner.build_strategy``) when Lightning asks for the
optimizers, and is told, in order:

- ``check()``: raise ValueError (before any training) if it cannot train this learner;
- ``configure_optimizers()``: what Lightning steps (gradient strategies: their optimizer and schedule;
  the others update the parameters themselves and return a ``StepCounter``);
- ``setup(x, y, state)``: at fit start, with the whole training set x [N, D] (or ``GridInputs``), y [N, n],
  and the ``state_dict()`` of the checkpoint being resumed (None: a fresh run);
- ``epoch_start()``, ``training_step(batch, batch_idx)``, ``epoch_end() -> bool`` (True: trained to its
  certificate or its own stopping rule; the run stops);
- ``state_dict()``: what a checkpoint keeps besides the module's parameters and buffers;
- ``report()``: how training ended, for metrics.json; ``warning()``: a line for the console when it
  stopped before its stopping rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:  # the learners import the strategies, never the other way round
    from ..learners.base import StructuredLearner

__all__ = ["StepCounter", "Strategy"]


class StepCounter(torch.optim.Optimizer):
    """What Lightning steps for a strategy that updates the parameters itself: under manual optimisation
    Lightning counts global steps (checkpoint names, logging intervals, resume progress) by optimizer steps,
    so the strategy steps this once per update, and it changes nothing."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        super().__init__(params or [torch.zeros(1, requires_grad=True)], {})

    def step(self, closure=None) -> None:
        return None


class Strategy:
    """A training strategy for one learner (see the module docstring for the call order)."""

    #: the ``model.solver`` name (or the learner's own algorithm) this strategy implements
    name: ClassVar[str] = ""
    #: True: Lightning's automatic optimisation (the loss's gradient, its optimizer); False: the strategy
    #: updates the parameters in ``training_step``
    automatic: ClassVar[bool] = False

    def __init__(self, learner: StructuredLearner) -> None:
        self.learner = learner
        #: the steps stopped to keep the time of the fit's closing work (a certificate) out of the time budget: the
        #: fit ends at this epoch's end, as at the budget, rather than run epochs without a step until it
        self.reserved = False

    def check(self) -> None:
        """Raise ValueError if this strategy cannot train ``learner`` (its energy, loss or options)."""

    def configure_optimizers(self) -> Any:
        return StepCounter(list(self.learner.parameters()))

    def setup(self, x: Any, y: torch.Tensor, state: dict[str, Any] | None = None) -> None:
        """Fit start: the whole training set (x [N, ...] on CPU, y [N, n]) and, when resuming, this strategy's
        ``state_dict()`` from the checkpoint (the module's weights are already loaded)."""

    def epoch_start(self) -> None:
        pass

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor | None:
        raise NotImplementedError

    def epoch_end(self) -> bool:
        """After an epoch: True when training is done (certified, or the strategy's own stopping rule)."""
        return False

    def train_end(self) -> None:
        """Fit end, while the learner is still on the training device (Lightning moves it back to the CPU after)."""

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint keeps of this strategy (None: nothing): plain values or CPU tensors."""
        return None

    def checkpoint_weights(self) -> dict[str, torch.Tensor]:
        """Energy parameters, by name, that a checkpoint holds instead of the current ones (default: none)."""
        return {}

    def report(self) -> dict[str, Any]:
        """How training ended, for metrics.json."""
        return {"solver": self.name}

    def warning(self) -> str | None:
        """A line for the console when training stopped before this strategy's stopping rule."""
        return None

    def step_counter(self) -> None:
        """Step Lightning's ``StepCounter`` (one global step per update of a self-updating strategy)."""
        self.learner.optimizers().step()
