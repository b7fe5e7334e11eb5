"""LogisticEnergy: nonlinear grid energies learned by message-biased logistic regression (Domke, NIPS 2013).

The energy F(x, y) = sum_i u(phi_i, y_i) + sum_ij v(phi_ij, y_i, y_j) on a grid, u and v from any function class
(``FUNCTIONS``: zero, const, linear, boost, mlp). ``method="logistic"`` trains it by Domke's Algorithm 1
(``structtorch.strategies.Algorithm1``: logistic regressions biased by the messages of the entropy-smoothed LP,
each function fitted by its own oracle); ``method="hinge"`` trains the same energy end to end on the same loss
(the smoothed-LP hinge, eq. 6) by minibatch gradient steps through ``smoothed_lp``'s Danskin gradient, the
baseline the paper compares against, warm-starting each image's messages from the previous epoch. Both keep the
messages per example (``ExampleState``: checkpointed, all-gathered under DDP).
"""

from __future__ import annotations

from typing import Any

import torch

from ..energies import FUNCTIONS, GridEnergy, make_function
from ..graph import Graph, check_float, check_int
from ..inference import smoothed_lp
from ..metrics import ExampleCounts, segmentation_scores
from ..plots import grid_functions_figure, grid_predictions_figure, pixel_accuracy_figure
from ..potentials import Potentials
from ..state import ExampleState
from ..strategies import OPTIMIZERS, Algorithm1, Strategy
from .base import StructuredLearner

__all__ = ["LogisticEnergy", "METHODS"]

#: model.method values: Domke's Algorithm 1, or the smoothed-LP hinge trained end to end
METHODS = ("logistic", "hinge")


class LogisticEnergy(StructuredLearner):
    """Domke's learner on grid images: F(x, y) = sum_i u(phi_i, y_i) + sum_ij v(phi_ij, y_i, y_j).

    Batches are ``(GridInputs, y [B, n], index [B])`` (``data=denoising``, ``data=horses``); the label graph is
    ``Graph.grid(height, width)``, n = height * width pixels with ``num_states`` states each. Testing adds the
    figure/ground scores of ``metrics.segmentation_scores`` (pixel error, IoU, per-image errors) to the metrics.

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
        margin_scale: weight of the Hamming term Delta.
        l2: 0 (default; the paper's objective has no regulariser, and Algorithm 1 takes no other); with
            method="hinge", the weight of lambda/2 ||w||^2 on the functions' parameters.
        picture_features: the unary features the prediction pictures show as the input image, one (grey) or three
            (RGB, in [0, 1]); default the first (the datamodule passes its own, e.g. data=horses its RGB).
        Other args as ``StructuredLearner``.
    """

    def __init__(self, num_features: int, num_labels: int, height: int, width: int, num_pair_features: int,
                 num_states: int = 2, unary: str = "linear", pairwise: str = "linear", method: str = "logistic",
                 eps: float = 0.1, passes: int = 25, predict_iters: int = 100, predict_eps: float | None = None,
                 fit_iters: int = 50, hidden: int = 20, unary_lr: float = 0.25, pairwise_lr: float = 0.05,
                 fit_epochs: int = 5, seed: int = 0, test_inference: str = "smoothed_lp", solver: str = "auto",
                 l2: float = 0.0, picture_features: list[int] | None = None, **kwargs) -> None:
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
        if method == "logistic" and l2 != 0:
            raise ValueError(f"model.method=logistic (Algorithm 1) has no regulariser: model.l2 must be 0, got {l2!r} "
                             f"(model.method=hinge uses it)")
        if method == "hinge" and solver not in ("auto", *OPTIMIZERS):
            raise ValueError(f"model.method=hinge trains by gradient steps: model.solver must be auto or one of "
                             f"{sorted(OPTIMIZERS)}, got {solver!r}")
        for name, v in (("eps", eps), *((("predict_eps", predict_eps),) if predict_eps is not None else ())):
            check_float(v, f"model.{name}", 0.0)
        for name, v in (("passes", passes), ("predict_iters", predict_iters)):
            check_int(v, f"model.{name}", 1)
        picture_features = [0] if picture_features is None else list(picture_features)
        if len(picture_features) not in (1, 3) or not all(0 <= int(f) < num_features for f in picture_features):
            raise ValueError(f"picture_features must name 1 (grey) or 3 (RGB) of the {num_features} unary features, "
                             f"got {picture_features!r}")
        self._opts = dict(height=height, width=width, num_pair_features=num_pair_features, num_states=num_states,
                          unary=unary, pairwise=pairwise, eps=float(eps), fit_iters=fit_iters, hidden=hidden,
                          unary_lr=unary_lr, pairwise_lr=pairwise_lr, fit_epochs=fit_epochs, seed=seed)
        super().__init__(num_features, num_labels, test_inference=self._predict_labels, solver=solver, l2=l2, **kwargs)
        self.save_hyperparameters({"test_inference": test_inference})
        self.example_state = ExampleState()  # Domke's lambda^k: [N_train, E, 2, K]
        self.example_state.add("messages", (self.graph.num_edges, 2, num_states))
        self._test_examples: tuple[torch.Tensor, ...] | None = None  # first test images, for the picture
        self.picture_features = picture_features
        self.image_counts = ExampleCounts()  # per test image: tp, fp, fn, tn

    grid_inputs = True  # train.build_learner: takes GridInputs batches and the grid sizes
    #: per-pixel accuracy (Domke's test error is 1 - it); a whole image is never exactly right, so subset accuracy
    #: and the per-image F1 say nothing here
    console_metrics = ("hamming_acc", "iou", "image_iou", "image_error_median", "image_error_max")

    # ------------------------------------------------------------------ energy
    def build_energy(self) -> GridEnergy:
        o = self._opts
        K = o["num_states"]
        common = dict(fit_iters=o["fit_iters"], hidden=o["hidden"], epochs=o["fit_epochs"])
        u = make_function(o["unary"], self.hparams.num_features, K, lr=o["unary_lr"], seed=o["seed"], **common)
        v = make_function(o["pairwise"], o["num_pair_features"], K * K, lr=o["pairwise_lr"], seed=o["seed"] + 1,
                          **common)
        return GridEnergy(u, v, Graph.grid(o["height"], o["width"]), K, scale=o["eps"])

    @property
    def solver_name(self) -> str:
        hp = self.hparams
        if hp.method == "logistic":
            return "logistic"
        return "adam" if hp.solver == "auto" else hp.solver

    def build_strategy(self) -> Strategy:
        if self.hparams.method == "logistic":
            return Algorithm1(self)
        return super().build_strategy()

    # ------------------------------------------------------------------ hinge (automatic optimisation)
    def loss(self, pot: Potentials, y: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Smoothed-LP hinge per image [B] (eq. 6) with ``passes`` warm-started sweeps; gradient by Danskin."""
        return self.warm_smoothed_hinge(pot, y, index, self.hparams.eps, self.hparams.passes)

    # ------------------------------------------------------------------ prediction and pictures
    def _predict_labels(self, pot: Potentials) -> torch.Tensor:
        hp = self.hparams
        return smoothed_lp(pot, hp.predict_eps or hp.eps, hp.predict_iters).assignment

    def test_step(self, batch: tuple, batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        y_hat = self._evaluate(batch, self.test_metrics)
        self.per_label.update(y_hat, y)
        self.image_counts.update(y_hat, y)
        if batch_idx == 0:
            self._test_examples = (x.unary[:4, :, self.picture_features].cpu(), y[:4].cpu(), y_hat[:4].cpu())

    def on_test_epoch_start(self) -> None:
        super().on_test_epoch_start()
        self.image_counts.reset()

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        for name, value in segmentation_scores(self.image_counts.compute()).items():
            self.log(f"test/{name}", value)
        if self._test_examples is not None:
            self._log_figure("test/predictions", self.predictions_figure())

    def test_figures(self) -> dict[str, Any]:
        """The per-pixel accuracy and ``predictions.png`` (``predictions_figure``)."""
        figures = super().test_figures()
        if self._test_examples is not None:
            figures["predictions.png"] = self.predictions_figure()
        return figures

    def predictions_figure(self):
        """The first test images of the last test run: input (``picture_features``), true labels, predictions."""
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
