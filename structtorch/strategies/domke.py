"""Structured learning via logistic regression: Algorithm 1 of Domke (NIPS 2013).

The loss of example k is the entropy-smoothed LP relaxation of the Hamming-rescaled hinge (eq. 6),
``-F(x^k, y^k) + A(theta^k)`` with ``theta^k = F(x^k, .) + Delta(y^k, .)`` (eq. 5); in the dual form of Thm. 2,
``A(theta) = min_lambda A(lambda, theta)`` (``smoothed_lp``'s value at its messages), so learning is
``min_F min_{lambda^k} sum_k [-F(x^k, y^k) + A(lambda^k, theta^k)]`` (eq. 12). Each learning iteration:

1. per-example biases from the messages (eq. 14);
2. for each factor type, a logistic regression with those biases (eq. 13), one function shared by every
   position, fitted on all positions of all training images together;
3. theta = eps * f + Delta;
4. a fixed number of star-update message passes (eq. 10), warm-started from the previous messages;

first for the unary function, then for the pairwise one. One learning iteration = one Lightning epoch.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..inputs import GridInputs
from ..losses import hamming_margin, smoothed_lp_hinge
from .base import Strategy

__all__ = ["Algorithm1"]


class Algorithm1(Strategy):
    """Domke's Algorithm 1 for a learner with a ``GridEnergy`` (``energy.unary_fn`` / ``pairwise_fn``: local
    functions with a ``fit(inputs, biases, targets, generator)`` oracle), an ``example_state`` field "messages"
    ([N, E, 2, K], lambda^k: checkpointed, all-gathered under DDP: each process passes the messages of its share
    of the images, every process fits the same functions on all images) and hyper-parameters eps, passes,
    margin_scale and seed."""

    name = "logistic"

    def setup(self, x: GridInputs, y: torch.Tensor, state: dict[str, Any] | None = None) -> None:
        if not isinstance(x, GridInputs):
            raise ValueError(f"{type(self.learner).__name__} trains on grid images: use a grid datamodule "
                             f"(data=denoising)")
        self.x, self.y = x.to(self.learner.device), y.to(self.learner.device)

    def training_step(self, batch: tuple, batch_idx: int) -> None:
        if batch_idx:  # one learning iteration per epoch, on the whole training set, at its first step
            return None
        learner = self.learner
        gen = torch.Generator().manual_seed(learner.hparams.seed * 1_000_003 + learner.global_step)  # resumable
        t0 = time.perf_counter()
        stats = self.learning_iteration(self.x, self.y, torch.arange(len(self.y), device=self.y.device), gen)
        self.step_counter()
        learner.log_dict({"train/objective": stats["objective"], "train/unary_logloss": stats["unary"],
                          "train/pairwise_logloss": stats["pairwise"],
                          "train/iteration_seconds": time.perf_counter() - t0},
                         on_step=False, on_epoch=True, batch_size=len(self.y), sync_dist=True)
        return None

    # ------------------------------------------------------------------ the algorithm
    def biases(self, messages: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-example biases of the unary and pairwise logistic regressions (eq. 14).

        messages: [N, E, 2, K] (``smoothed_lp``'s, which enter node beliefs with + and edge beliefs with -:
        the paper's lambda with the opposite sign); y: [N, n]. Returns b_u [N, n, K] and b_p [N, E, K * K]
        (state k K + l: k at ``edges[e, 0]``), both divided by eps.
        """
        hp, energy = self.learner.hparams, self.learner.energy
        K, edges = energy.num_states, energy.graph.edges.to(messages.device)
        delta = hamming_margin(y, K, hp.margin_scale, messages.dtype)  # Delta(y^k, y_i), eq. (5)
        b_u = delta.index_add(1, edges.reshape(-1), messages.flatten(1, 2))  # Delta + sum_e m_{e->i}, eq. (14)
        b_p = -(messages[:, :, 0, :, None] + messages[:, :, 1, None, :])  # Delta_e = 0, eq. (14)
        return b_u / hp.eps, b_p.flatten(-2) / hp.eps

    def pass_messages(self, x: GridInputs, y: torch.Tensor, messages: torch.Tensor | None,
                      iters: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``iters`` (default ``passes``) star-update sweeps (eq. 10) on theta = eps f + Delta (steps 3-4):
        (the per-example smoothed hinge at the new messages [N], the messages [N, E, 2, K])."""
        hp = self.learner.hparams
        return smoothed_lp_hinge(self.learner.energy(x), y, hp.eps, hp.passes if iters is None else iters,
                                 messages=messages, scale=hp.margin_scale)

    def objective(self, x: GridInputs, y: torch.Tensor, messages: torch.Tensor | None, iters: int = 0
                  ) -> torch.Tensor:
        """Per-example smoothed hinge at these messages (eq. 12's summand) [N], after ``iters`` more passes."""
        with torch.no_grad():
            return self.pass_messages(x, y, messages, iters)[0]

    def learning_iteration(self, x: GridInputs, y: torch.Tensor, index: torch.Tensor, generator: torch.Generator
                           ) -> dict[str, float]:
        """One iteration of Algorithm 1 on the whole training set x [N, ...], y [N, n] (``index`` [N]: their
        example ids): fit u, pass messages, fit v, pass messages. Returns the fits' logistic losses and the
        mean per-image objective after the iteration (this process's images)."""
        learner = self.learner
        trainer = learner._trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        mine = torch.arange(rank, len(index), world, device=index.device)  # this process's images
        x_mine = x if world == 1 else x[mine]  # the same tensors when alone (function classes may cache on them)
        energy, state = learner.energy, learner.example_state
        K, edges = energy.num_states, energy.graph.edges.to(y.device)
        stats: dict[str, float] = {}
        with torch.no_grad():
            for part in ("unary", "pairwise"):
                messages = state.get("messages", index).to(x.dtype)
                b_u, b_p = self.biases(messages, y)  # step 1
                if part == "unary":  # step 2, eq. (13): all pixels of all images together
                    stats[part] = energy.unary_fn.fit(x.unary.flatten(0, 1), b_u.flatten(0, 1), y.flatten(),
                                                      generator)
                else:
                    target = (y[:, edges[:, 0]] * K + y[:, edges[:, 1]]).flatten()
                    stats[part] = energy.pairwise_fn.fit(x.pairwise.flatten(0, 1), b_p.flatten(0, 1), target,
                                                         generator)
                loss, new = self.pass_messages(x_mine, y[mine], messages[mine])  # steps 3-4
                state.set("messages", index[mine], new)
            stats["objective"] = float(loss.mean())
        return stats
