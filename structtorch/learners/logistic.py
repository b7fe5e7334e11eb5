"""LogisticEnergy: nonlinear grid energies learned by message-biased logistic regression (Domke, NIPS 2013).

The loss of example k is the entropy-smoothed LP relaxation of the Hamming-rescaled hinge (eq. 6),
``-F(x^k, y^k) + A(theta^k)`` with ``theta^k = F(x^k, .) + Delta(y^k, .)`` (eq. 5); in the dual form of
Thm. 2, ``A(theta) = min_lambda A(lambda, theta)`` (``smoothed_lp``'s value at its messages), so learning is
``min_F min_{lambda^k} sum_k [-F(x^k, y^k) + A(lambda^k, theta^k)]`` (eq. 12). Algorithm 1 alternates:

1. per-example biases from the messages (eq. 14);
2. for each factor type, a logistic regression with those biases (eq. 13), one function shared by every
   position, fitted on all positions of all training images together;
3. theta = eps * f + Delta;
4. a fixed number of star-update message passes (eq. 10), warm-started from the previous messages.

One learning iteration (one training epoch) = fit the unary function, ``passes`` message passes, fit the
pairwise function, ``passes`` message passes (paper: 25 each, eps = 0.1). The messages are per-example
state (``ExampleState``: checkpointed, all-gathered under DDP; each process passes the messages of its
share of the images, every process fits the same functions on all images).

``method="hinge"`` trains the same energy end to end on the same loss by minibatch gradient steps through
``smoothed_lp``'s Danskin gradient (the baseline the paper compares against), warm-starting each image's
messages from the previous epoch.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.nn import functional as F

from ..energies import FUNCTIONS, GridEnergy, make_function
from ..graph import Graph
from ..inference import smoothed_lp
from ..inference.smoothed import SmoothedLPResult
from ..inputs import GridInputs
from ..losses import check_loss_finite, hamming_augment
from ..plots import grid_functions_figure, grid_predictions_figure, pixel_accuracy_figure
from ..potentials import Potentials
from ..state import ExampleState
from .base import _GRADIENT, SolverSteps, StructuredLearner, _training_tensors

__all__ = ["LogisticEnergy", "METHODS"]

#: model.method values: Domke's Algorithm 1, or the smoothed-LP hinge trained end to end
METHODS = ("logistic", "hinge")


class LogisticEnergy(StructuredLearner):
    """Domke's learner on grid images: F(x, y) = sum_i u(phi_i, y_i) + sum_ij v(phi_ij, y_i, y_j).

    Batches are ``(GridInputs, y [B, n], index [B])`` (``data=denoising``); the label graph is
    ``Graph.grid(height, width)``, n = height * width pixels with ``num_states`` states each.

    Args:
        num_features, num_pair_features: Du and Dp, the per-pixel and per-edge features.
        num_labels: n (must be height * width); height, width: the grid.
        unary, pairwise: function classes of u and v (``FUNCTIONS``: zero, const, linear, boost, mlp; boost
            needs xgboost).
        method: "logistic" (Algorithm 1) or "hinge" (end to end by ``solver`` adam / adamw / sgd with ``lr``).
        eps: the entropy weight of the smoothed LP (paper .1); passes: message passes after each fit (paper 25)
            and, for "hinge", per training step.
        predict_iters, predict_eps: message passes and smoothing of prediction (cold start; predict_eps None:
            eps), decoded by the node pseudo-marginals.
        fit_iters: L-BFGS iterations per fit of const / linear functions.
        hidden, unary_lr, pairwise_lr, fit_epochs: MLP hidden units, SGD steps (paper .25 / .05) and SGD passes
            over the positions per fit (5: with 1 the training objective falls much slower); seed: initial MLP
            weights and SGD orders (and xgboost's seed).
        margin_scale: weight of the Hamming term Delta. ``l2`` is not used: the paper's objective has no
            regulariser. Other args as ``StructuredLearner``.
    """

    def __init__(self, num_features: int, num_labels: int, height: int, width: int, num_pair_features: int,
                 num_states: int = 2, unary: str = "linear", pairwise: str = "linear", method: str = "logistic",
                 eps: float = 0.1, passes: int = 25, predict_iters: int = 100, predict_eps: float | None = None,
                 fit_iters: int = 50, hidden: int = 20, unary_lr: float = 0.25, pairwise_lr: float = 0.05,
                 fit_epochs: int = 5, seed: int = 0, test_inference: str = "smoothed_lp", solver: str = "auto",
                 **kwargs) -> None:
        if method not in METHODS:
            raise ValueError(f"model.method must be one of {METHODS}, got {method!r}")
        for name, v in (("unary", unary), ("pairwise", pairwise)):
            if v not in FUNCTIONS:
                raise ValueError(f"model.{name} must be one of {list(FUNCTIONS)}, got {v!r}")
        if num_labels != height * width:
            raise ValueError(f"LogisticEnergy: num_labels={num_labels} must be height * width = {height} * {width}")
        if test_inference != "smoothed_lp":
            raise ValueError(f"LogisticEnergy predicts with smoothed_lp; got test_inference={test_inference!r}")
        if method == "logistic" and solver != "auto":
            raise ValueError(f"model.method=logistic fits each function by its own oracle (Algorithm 1); "
                             f"model.solver={solver!r} applies to model.method=hinge only")
        if method == "hinge" and solver not in ("auto", *_GRADIENT):
            raise ValueError(f"model.method=hinge trains by gradient steps: model.solver must be auto or one of "
                             f"{sorted(_GRADIENT)}, got {solver!r}")
        for name, v in (("eps", eps), *((("predict_eps", predict_eps),) if predict_eps is not None else ())):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"model.{name} must be a number > 0, got {v!r}")
        for name, v in (("passes", passes), ("predict_iters", predict_iters)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model.{name} must be a positive int, got {v!r}")
        self._opts = dict(height=height, width=width, num_pair_features=num_pair_features, num_states=num_states,
                          unary=unary, pairwise=pairwise, eps=float(eps), fit_iters=fit_iters, hidden=hidden,
                          unary_lr=unary_lr, pairwise_lr=pairwise_lr, fit_epochs=fit_epochs, seed=seed)
        super().__init__(num_features, num_labels, test_inference=self._predict_labels, solver=solver, **kwargs)
        self.save_hyperparameters({"test_inference": test_inference})
        self.example_state = ExampleState()  # Domke's lambda^k: [N_train, E, 2, K]
        self.example_state.add("messages", (self.graph.num_edges, 2, num_states))
        self._train: tuple[GridInputs, torch.Tensor] | None = None  # the training set on the device (fit)
        self._test_examples: tuple[torch.Tensor, ...] | None = None  # first test images, for the picture

    grid_inputs = True  # train.build_learner: takes GridInputs batches and the grid sizes

    # ------------------------------------------------------------------ energy
    def build_energy(self) -> GridEnergy:
        o = self._opts
        K = o["num_states"]
        common = dict(fit_iters=o["fit_iters"], hidden=o["hidden"], epochs=o["fit_epochs"])
        u = make_function(o["unary"], self.hparams.num_features, K, lr=o["unary_lr"], seed=o["seed"], **common)
        v = make_function(o["pairwise"], o["num_pair_features"], K * K, lr=o["pairwise_lr"], seed=o["seed"] + 1,
                          **common)
        return GridEnergy(u, v, Graph.grid(o["height"], o["width"]), K, scale=o["eps"])

    def regularizer(self) -> torch.Tensor:
        """0: Domke's objective (eq. 12) has no regulariser."""
        return torch.zeros((), device=self.device)

    @property
    def solver_name(self) -> str:
        hp = self.hparams
        if hp.method == "logistic":
            return "logistic"
        return "adam" if hp.solver == "auto" else hp.solver

    # ------------------------------------------------------------------ Algorithm 1
    def biases(self, messages: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-example biases of the unary and pairwise logistic regressions (eq. 14).

        messages: [N, E, 2, K] (``smoothed_lp``'s, which enter node beliefs with + and edge beliefs with -:
        the paper's lambda with the opposite sign); y: [N, n]. Returns b_u [N, n, K] and b_p [N, E, K * K]
        (state k K + l: k at ``edges[e, 0]``), both divided by eps.
        """
        hp = self.hparams
        K, edges = self.energy.num_states, self.graph.edges.to(messages.device)
        delta = hp.margin_scale * (1.0 - F.one_hot(y, K).to(messages.dtype))  # Delta(y^k, y_i), eq. (5)
        b_u = delta.index_add(1, edges.reshape(-1), messages.flatten(1, 2))  # Delta + sum_e m_{e->i}, eq. (14)
        b_p = -(messages[:, :, 0, :, None] + messages[:, :, 1, None, :])  # Delta_e = 0, eq. (14)
        return b_u / hp.eps, b_p.flatten(-2) / hp.eps

    def pass_messages(self, x: GridInputs, y: torch.Tensor, messages: torch.Tensor | None,
                      iters: int | None = None) -> SmoothedLPResult:
        """``iters`` (default ``passes``) star-update sweeps (eq. 10) on theta = eps f + Delta (Alg. 1, step 3)."""
        hp = self.hparams
        theta = hamming_augment(self.energy(x), y, hp.margin_scale)
        return smoothed_lp(theta, hp.eps, hp.passes if iters is None else iters, messages=messages)

    def objective(self, x: GridInputs, y: torch.Tensor, messages: torch.Tensor | None, iters: int = 0
                  ) -> torch.Tensor:
        """Per-example smoothed hinge at these messages (eq. 12's summand) [N], after ``iters`` more passes."""
        with torch.no_grad():
            res = self.pass_messages(x, y, messages, iters)
            return res.value - self.energy(x).score(y)

    def learning_iteration(self, x: GridInputs, y: torch.Tensor, index: torch.Tensor, generator: torch.Generator
                           ) -> dict[str, float]:
        """One iteration of Algorithm 1 on the whole training set x [N, ...], y [N, n] (``index`` [N]: their
        example ids): fit u, pass messages, fit v, pass messages. Returns the fits' logistic losses and the
        mean per-image objective after the iteration (this process's images)."""
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self._trainer is not None else (1, 0)
        mine = torch.arange(rank, len(index), world, device=index.device)  # this process's images
        x_mine = x if world == 1 else x[mine]  # the same tensors when alone (function classes may cache on them)
        K, edges = self.energy.num_states, self.graph.edges.to(y.device)
        stats: dict[str, float] = {}
        with torch.no_grad():
            for part in ("unary", "pairwise"):
                messages = self.example_state.get("messages", index).to(x.dtype)
                b_u, b_p = self.biases(messages, y)  # step 1
                if part == "unary":  # step 2, eq. (13): all pixels of all images together
                    stats[part] = self.energy.unary_fn.fit(x.unary.flatten(0, 1), b_u.flatten(0, 1), y.flatten(),
                                                           generator)
                else:
                    target = (y[:, edges[:, 0]] * K + y[:, edges[:, 1]]).flatten()
                    stats[part] = self.energy.pairwise_fn.fit(x.pairwise.flatten(0, 1), b_p.flatten(0, 1), target,
                                                              generator)
                res = self.pass_messages(x_mine, y[mine], messages[mine])  # steps 3-4
                self.example_state.set("messages", index[mine], res.messages)
            stats["objective"] = float((res.value - self.energy(x_mine).score(y[mine])).mean())
        return stats

    # ------------------------------------------------------------------ Lightning (logistic: manual)
    def configure_optimizers(self):
        if self.hparams.method == "hinge":
            return super().configure_optimizers()
        self.automatic_optimization = False
        # SolverSteps only counts learning iterations; Zero/Zero has no parameters, so count on a placeholder
        return SolverSteps(list(self.parameters()) or [torch.zeros(1, requires_grad=True)])

    def on_fit_start(self) -> None:
        if self.hparams.method == "hinge":
            return super().on_fit_start()
        x, y = _training_tensors(self.trainer)
        if not isinstance(x, GridInputs):
            raise ValueError("LogisticEnergy trains on grid images: use a grid datamodule (data=denoising)")
        self._train = (x.to(self.device), y.to(self.device))

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor | None:
        if self.hparams.method == "hinge":
            return super().training_step(batch, batch_idx)
        if batch_idx:  # one learning iteration per epoch, on the whole training set, at its first step
            return None
        x, y = self._train
        gen = torch.Generator().manual_seed(self._opts["seed"] * 1_000_003 + self.global_step)  # resumable
        t0 = time.perf_counter()
        stats = self.learning_iteration(x, y, torch.arange(len(y), device=y.device), gen)
        self.optimizers().step()
        self.log_dict({"train/objective": stats["objective"], "train/unary_logloss": stats["unary"],
                       "train/pairwise_logloss": stats["pairwise"],
                       "train/iteration_seconds": time.perf_counter() - t0},
                      prog_bar=False, on_step=False, on_epoch=True, batch_size=len(y), sync_dist=True)
        return None

    def on_train_epoch_end(self) -> None:
        if self.hparams.method == "hinge":
            super().on_train_epoch_end()

    # ------------------------------------------------------------------ hinge (automatic optimisation)
    def loss(self, pot: Potentials, y: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Smoothed-LP hinge per image [B] (eq. 6) with ``passes`` warm-started sweeps; gradient by Danskin."""
        hp = self.hparams
        warm = None if index is None else self.example_state.get("messages", index).to(pot.dtype)
        res = smoothed_lp(hamming_augment(pot, y, hp.margin_scale), hp.eps, hp.passes, messages=warm)
        if index is not None and self.training:
            self.example_state.set("messages", index, res.messages)
        return check_loss_finite(res.value - pot.score(y), pot, y, "LogisticEnergy.loss", index=index)

    # ------------------------------------------------------------------ prediction and pictures
    def _predict_labels(self, pot: Potentials) -> torch.Tensor:
        hp = self.hparams
        return smoothed_lp(pot, hp.predict_eps or hp.eps, hp.predict_iters).assignment

    def test_step(self, batch: tuple, batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        y_hat = self._evaluate(batch, self.test_metrics)
        self.per_label.update(y_hat, y)
        if batch_idx == 0:
            self._test_examples = (x.unary[:4, :, 0].cpu(), y[:4].cpu(), y_hat[:4].cpu())

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        if self._test_examples is not None:
            self._log_figure("test/predictions", self.predictions_figure())

    def predictions_figure(self):
        """Test images of the last test run: labels, noisy input (first unary feature), predictions."""
        o = self._opts
        return grid_predictions_figure(*self._test_examples, o["height"], o["width"],
                                       f"LogisticEnergy ({o['unary']} / {o['pairwise']}, {self.hparams.method})")

    def per_label_figure(self):
        """Per-pixel test accuracy as an image."""
        o = self._opts
        return pixel_accuracy_figure(self.test_per_label["accuracy"], o["height"], o["width"],
                                     "LogisticEnergy: per-pixel test accuracy")

    def per_label_summary(self) -> dict[str, Any]:
        """Per-pixel test accuracy and F1 summarised over the H*W pixels (the per-pixel map: ``per_label.png``)."""
        stats = self.test_per_label
        return {"pixels": len(stats["accuracy"]), **{
            k: {"mean": float(stats[k].mean()), "min": float(stats[k].min()), "max": float(stats[k].max())}
            for k in ("accuracy", "f1")}}

    def structure_figure(self):
        """The learned functions against the first feature (others at 1, the constant), as Domke's Fig. 1."""
        o = self._opts
        return grid_functions_figure(self.energy, f"LogisticEnergy: {o['unary']} unary, {o['pairwise']} pairwise")

    def structure_summary(self) -> dict[str, Any]:
        """The grid and the function classes (the structure is fixed), for metrics.json."""
        o = self._opts
        return {"graph": f"grid {o['height']}x{o['width']}", "num_edges": self.graph.num_edges,
                "is_forest": bool(self.graph.is_forest), "unary": o["unary"], "pairwise": o["pairwise"],
                "method": self.hparams.method}
