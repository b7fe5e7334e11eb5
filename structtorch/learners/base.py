"""StructuredLearner: the LightningModule every learner subclasses.

A learner supplies an energy (``build_energy``); the base class brings the loss (structured
hinge with Hamming margin rescaling, or CRF likelihood), the training inference (the
loss-augmented max), the test inference (prediction), l2 regularisation, optimizers,
metrics and logging.

Structure belongs to the learner: a learner that chooses its label graph from the training data
builds its energy on a candidate graph and overrides ``build_structure(x, y) -> mask``; the base
class calls it once before training (``setup("fit")``), keeps the mask in the checkpoint
(``structure_mask`` buffer) and restricts the energy to it (``Energy.restrict``), also when a
checkpoint is loaded. ``train.py`` knows no learner by name.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from ..energies import Energy
from ..folds import fold_assignment
from ..graph import Graph, check_bool, check_float, check_int
from ..inference import tree_f1, tree_kbest, tree_map, tree_mpm
from ..losses import crf_nll, map_value, smoothed_lp_hinge, structured_hinge, zero_one_hinge
from ..metrics import EXAMPLE_METRICS, PerLabelCounts, example_scores, multilabel_metrics
from ..plots import close_figure, per_label_figure, structure_figure
from ..potentials import Potentials
from ..progress import budget_share, out_of_time, phase
from ..solvers import BCFW, Oracle, SmoothedMax, independent_duals, independent_svms, tree_oracle, tree_smoothed_max
from ..solvers.dcd import MAX_EPOCHS
from ..strategies import SOLVERS, Strategy, solver_strategy

__all__ = ["SOLVERS", "StructuredLearner", "TRAIN_INFERENCE", "TEST_INFERENCE"]

#: name -> loss-augmented max value [*B] of Potentials (the max inside the structured hinge)
TRAIN_INFERENCE: dict[str, Callable[[Potentials], torch.Tensor]] = {"tree_map": map_value}
#: name -> predicted assignment [*B, n] of Potentials
#: (tree_map: the joint mode, for subset accuracy; tree_mpm: each label's posterior mode, for Hamming; tree_f1:
#: plug-in expected F1; ``inference.decode``)
TEST_INFERENCE: dict[str, Callable[[Potentials], torch.Tensor]] = {"tree_map": lambda pot: tree_map(pot)[1],
                                                                   "tree_mpm": tree_mpm, "tree_f1": tree_f1}
#: structure learning gets at most this share of what is left of ``trainer.time_budget``, the model it chose the
#: rest: MST on tmc2007 spent the whole 720 s scoring edges, then predicted the empty set for every test row
STRUCTURE_SHARE = 0.5
#: a phase before the fit (RTA's feature-map CV, Greedy's empty model) gets at most this share of what is left of
#: ``trainer.time_budget``
START_SHARE = 0.2
#: a start from Independent's solution (``independent_solution``) gets at most this share of what is left of
#: ``trainer.time_budget``: the fit refines it, so a start cut short caps the model. At bookmarks' shape (55,349
#: rows) Independent's DCD certifies in 140-180 s; cut at 54 s (0.2 of what MST's and CRANK's structure phases
#: left) it predicted 94.18% subset against 97.51%, and CRANK's refit from it ended at 93.97
INDEPENDENT_START_SHARE = 0.5


class StructuredLearner(L.LightningModule):
    """Base learner. Batches are ``(x [B, D] float, y [B, n] long[, index [B] long])``.

    Args:
        num_features, num_labels: input and output sizes (D, n).
        energy: an ``Energy`` to train; None calls ``build_energy()`` (what subclasses implement).
        loss: "hinge" (M3N, Hamming margin rescaling) or "crf" (negative log-likelihood, trees).
        train_inference / test_inference: names in TRAIN_INFERENCE / TEST_INFERENCE, or callables.
        l2: lambda of the lambda/2 ||w||^2 regulariser (added to the mean loss over the N training examples);
            "auto" (the default): lambda = ``auto_l2`` / N, set when fitting starts, so the regulariser weighs the
            same against each example's loss at N = 300 as at N = 20,000 (liblinear's C = 1 / (lambda N) stays
            fixed); or a list of lambdas: a regularisation grid, trained with ``cv_folds``-fold cross-validation
            on the training set as one batched model (len(l2) * (cv_folds + 1) models: every fold of every
            lambda, and every lambda on the whole training set); after training, the lambda with the best mean held-out
            ``cv_metric`` is chosen and its whole-training-set model predicts (``cv_report``). Needs a
            certified solver and an energy built with ``num_models=self.num_models``.
        cv_folds, cv_metric: folds of the grid's cross-validation (>= 2) and its metric: "hamming_acc",
            "subset_acc" or "example_f1".
        solver: how the objective is minimised (``SOLVERS``). "lbfgs": full-batch L-BFGS on the
            entropy-smoothed hinge (``SmoothedLBFGS``) or on the CRF likelihood, "bcfw": block-coordinate
            Frank-Wolfe in the SSVM dual (``BCFW``), "dcd": dual coordinate descent on one linear SVM per
            label (``DualCD``, liblinear's solver; Independent only, on the CPU's fused kernel); all are
            certified: they log ``train/duality_gap`` (relative) every epoch and stop the Trainer once it is
            <= ``tol`` (``max_epochs`` is then only a cap), and they regularise biases too, with weight
            ``bias_reg`` * l2. "adam", "adamw", "sgd": minibatch gradient steps for ``max_epochs`` (non-convex
            energies), biases unregularised. "auto": lbfgs for an energy linear in its parameters (``Energy.is_linear``)
            with a smoothed max for the training inference (trees; Full), else adam (Independent: dcd).
        lr, lr_schedule ("cosine" or "none"): the gradient optimizers' step size.
        tol: relative duality gap at which a certified solver stops.
        bias_reg: rho, the certified solvers' bias regulariser relative to l2; "auto" (default): 1e-4 with
            lbfgs and dcd (an almost free bias; dcd gets there by continuation, ``DualCD``) and 1 with bcfw
            (liblinear's convention: BCFW's dual steps stall along a nearly free bias, e.g. a relative gap of 0.77
            after 60 epochs on emotions at 1e-4).
        solver_iters: L-BFGS iterations (solver="lbfgs"; certified every 20), DCD epochs (solver="dcd";
            certified every 5) or BCFW passes over the training set (solver="bcfw"; certified where the running
            gap estimate says it may) per training epoch at most.
        margin: "hamming" (M3N: the hinge's margin is the Hamming distance) or "zero_one" (margin against the
            worst violator, the best assignment other than the label: ``worst_violator``; RTA's Def. 6).
        margin_scale: weight of the margin term in the hinge.
        bcfw_averaging: solver="bcfw" certifies (and predicts with) the weighted average of its iterates
            (``BCFW(averaging=True)``).
        bcfw_active_set: solver="bcfw" takes pairwise steps with up to this many labellings held per training row
            (``BCFW(active_set=...)``; 0: Frank-Wolfe steps); "auto": 32 (fewer where memory or cost needs it) where its
            blocks are whole rows and its oracle returns labellings (RTA), else Frank-Wolfe steps.
        label_names: names of the n labels (pictures, metrics.json); default "y0", "y1", ...
    """

    #: True for learners of grid images (batches of ``GridInputs``, see ``structtorch.data.grid``)
    grid_inputs: bool = False
    #: the test metrics (names without "test/") of the console summary; None: all (metrics.json has all anyway)
    console_metrics: tuple[str, ...] | None = None
    #: model.l2=auto: lambda = auto_l2 / N. 100 is liblinear's C = 0.01, the C that 3-fold CV chooses for one
    #: hinge-loss SVM per label on standardised features on scene, emotions, yeast and birds (0.03 on flags)
    auto_l2: float = 100.0
    #: model.l2=auto never regularises more than this (None: no cap)
    max_auto_l2: float | None = None
    #: the values model.margin takes
    MARGINS: tuple[str, ...] = BCFW.MARGINS
    #: DCD epochs at most in the start from Independent's solution (``independent_solution``)
    start_epochs: int = MAX_EPOCHS

    def __init__(
        self,
        num_features: int,
        num_labels: int,
        energy: Energy | None = None,
        loss: str = "hinge",
        train_inference: str | Callable = "tree_map",
        test_inference: str | Callable = "tree_map",
        l2: float | list[float] | str = "auto",
        solver: str = "auto",
        lr: float = 0.01,
        lr_schedule: str = "cosine",
        tol: float = 1e-3,
        bias_reg: float | str = "auto",
        solver_iters: int = 200,
        cv_folds: int = 5,
        cv_metric: str = "hamming_acc",
        margin: str = "hamming",
        margin_scale: float = 1.0,
        bcfw_averaging: bool = False,
        bcfw_active_set: int | str = "auto",
        label_names: list[str] | None = None,
    ) -> None:
        super().__init__()
        if loss not in ("hinge", "crf"):
            raise ValueError(f"loss must be 'hinge' or 'crf', got {loss!r}")
        if margin not in self.MARGINS:
            raise ValueError(f"{type(self).__name__}: margin must be one of {self.MARGINS}, got {margin!r}")
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
        check_float(tol, "tol", 0.0)
        if bias_reg != "auto":
            check_float(bias_reg, "bias_reg", 0.0, expected="'auto' or a number > 0")
        check_int(solver_iters, "solver_iters", 1)
        check_bool(bcfw_averaging, "bcfw_averaging")
        if bcfw_active_set != "auto":
            check_int(bcfw_active_set, "bcfw_active_set", 0, expected="'auto' or an integer >= 0")
        self._l2_grid = _check_l2(l2)  # None for "auto" until resolve_l2
        check_int(cv_folds, "cv_folds", 2)
        if cv_metric not in EXAMPLE_METRICS:
            raise ValueError(f"cv_metric must be one of {sorted(EXAMPLE_METRICS)}, got {cv_metric!r}")
        #: None for one l2; else the batched models of the grid, len(l2) * (cv_folds + 1)
        self.num_models = None if self._l2_grid is None or len(self._l2_grid) == 1 else \
            len(self._l2_grid) * (cv_folds + 1)
        if label_names is not None and len(label_names) != num_labels:
            raise ValueError(f"label_names must name the {num_labels} labels, got {len(label_names)} names")
        self.save_hyperparameters(ignore=["energy"])
        # [E, 2]: the candidate label graph chosen from the training set (``build_candidates``), once chosen
        self.register_buffer("candidate_edges", torch.zeros(0, 2, dtype=torch.long))
        self.energy = energy if energy is not None else self.build_energy()
        self.register_buffer("structure_mask", torch.zeros(0, dtype=torch.bool))  # [E candidate] once learned
        # the model that predicts (grid: index into the batched models; chosen by cross-validation)
        self.register_buffer("selected_model", torch.tensor(self._full_model(0)))
        self.cv_report: dict[str, Any] | None = None
        self.per_label = PerLabelCounts(num_labels)
        self._train_max = _lookup(train_inference, TRAIN_INFERENCE, "train_inference")
        self._predict = _lookup(test_inference, TEST_INFERENCE, "test_inference")
        self.val_metrics = multilabel_metrics("val/", num_labels)
        self.test_metrics = multilabel_metrics("test/", num_labels)
        self._strategy: Strategy | None = None  # how the parameters are fitted (``strategy``)
        self._strategy_state: dict[str, Any] | None = None  # from a checkpoint, handed to the strategy at fit start
        self.restored = False  # set-up taken from a checkpoint before fitting (``restore_set_up``)
        self._epoch_phase = ExitStack()  # the running epoch's progress phase (``structtorch.progress``)
        self._first_epoch = 0  # the first epoch of the current fit (a resumed fit starts later)
        self.stopped_by: str | None = None  # "time_budget" when the run's budget ended training

    # ------------------------------------------------------------------ what subclasses supply
    def build_energy(self) -> Energy:
        """The energy of this learner (subclasses override, or pass ``energy=``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_energy() or be given energy=")

    def energy_labels(self, y: torch.Tensor) -> torch.Tensor:
        """The labels y [B, n] as the energy's graph holds them (what the training loss compares with); the
        identity, except for learners whose graph copies the labels (MAM: one copy per tree)."""
        return y

    def build_candidates(self, x: torch.Tensor, y: torch.Tensor) -> Graph | None:
        """The candidate label graph the structure is chosen from, from the training set x [N, D], y [N, n]
        (e.g. each label's most dependent partners, ``structure.candidate_graph``); None (default): the graph
        ``build_energy`` built. A new graph rebuilds the energy on it (``set_candidates``) before
        ``build_structure``."""
        return None

    def set_candidates(self, graph: Graph) -> None:
        """Rebuild the energy (fresh weights) on the candidate ``graph``, whose edges are kept in the checkpoint
        (``candidate_edges``); ``build_energy`` reads them through ``candidate_graph``. Learners holding other
        per-edge state rebuild it too."""
        self.candidate_edges = graph.edges.reshape(-1, 2).clone().to(self.candidate_edges.device)
        self.energy = self.build_energy().to(self.device)

    def candidate_graph(self) -> Graph | None:
        """The candidate graph chosen from the training set (``set_candidates``), None before."""
        if not self.candidate_edges.numel():
            return None
        return Graph(self.hparams.num_labels, self.candidate_edges.cpu())

    def search_graph(self, m: int | None) -> Graph:
        """The graph a structure search with ``m`` candidate partners per label (``structure.candidate_graph``)
        chooses from: the candidate graph once chosen from the training labels; before that the complete graph
        while it is the candidate graph anyway (n <= 2 m + 1, or m None), else no edges."""
        n, chosen = self.hparams.num_labels, self.candidate_graph()
        if chosen is not None:
            return chosen
        return Graph.complete(n) if m is None or n <= 2 * m + 1 else Graph.empty(n)

    def warm_start(self, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor, mask: torch.Tensor | None
                   ) -> torch.Tensor | None:
        """Before a fresh certified L-BFGS fit on x [N, D], y [N, n] (0/1) at lambda ``lam`` (a float or [M]) on the
        rows ``mask`` [M, N] (None: all): set the energy's starting weights near the optimum and return their
        objective [M] (about), or leave them as built and return None (the default)."""
        return None

    def independent_solution(self, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor,
                             mask: torch.Tensor | None, duals: bool = False
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | torch.Tensor | None:
        """Independent's weights [M, n, D], biases [M, n] and objective [M] at lambda ``lam`` and this learner's
        ``bias_reg`` (``independent_svms``, within ``INDEPENDENT_START_SHARE`` of the time left), for
        ``warm_start``; with ``duals`` its dual instead (``independent_duals``: [M, N, n] in [0, 1]), for
        ``dual_start``. None with ``model.independent_start=false`` or where its kernel cannot be built."""
        if not self.hparams.get("independent_start", False):
            return None
        with phase("start at Independent's solution"), budget_share(INDEPENDENT_START_SHARE):
            return (independent_duals if duals else independent_svms)(x, y, lam, mask, bias_reg=self.bias_reg,
                                                                      max_epochs=self.start_epochs)

    def dual_start(self, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor, mask: torch.Tensor | None
                   ) -> torch.Tensor | None:
        """Before a fresh BCFW fit on x [N, D], y [N, n] (0/1) at lambda ``lam`` (a float or [M]) on the rows ``mask``
        [M, N] (None: all): a starting dual point as product distributions q [N, M, n, K] (``BCFW.start_at``), or
        None (the default: from w = 0)."""
        return None

    @property
    def fit_device(self) -> torch.device:
        """The device this learner trains on: its trainer's (already known in ``setup``, before Lightning moves the
        learner there), else the learner's own."""
        return self._trainer.strategy.root_device if self._trainer is not None else self.device

    def build_structure(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """The edges to keep, bool [E] over ``self.energy.graph`` (the candidate graph), chosen from the
        training set x [N, D], y [N, n]; None (default) keeps the energy's graph as built."""
        return None

    def loss(self, pot: Potentials, y: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Per-example training loss [B]; ``index`` [B] identifies the training examples (warm starts)."""
        if self.hparams.loss == "crf":
            return crf_nll(pot, y)
        if self.margin == "zero_one":
            return zero_one_hinge(pot, y, self.worst_violator, self.hparams.margin_scale)
        return structured_hinge(pot, y, self._train_max, self.hparams.margin_scale)

    def warm_smoothed_hinge(self, pot: Potentials, y: torch.Tensor, index: torch.Tensor | None, eps: float,
                            iters: int, tol: float | None = None) -> torch.Tensor:
        """The smoothed-LP hinge [B] (``smoothed_lp_hinge``) of a batch, warm-started from each training example's
        messages (``self.example_state`` field "messages", indexed by ``index`` [B]), which it updates while
        training."""
        warm = None if index is None else self.example_state.get("messages", index).to(pot.dtype)
        loss, messages = smoothed_lp_hinge(pot, y, eps, iters, warm, tol, self.hparams.margin_scale)
        if index is not None and self.training:
            self.example_state.set("messages", index, messages)
        return loss

    def worst_violator(self, pot: Potentials, y: torch.Tensor) -> torch.Tensor:
        """The best assignment other than y [*B, n] (margin="zero_one"); default: ``tree_kbest`` with k = 1."""
        return tree_kbest(pot, 1, exclude=y)[1][..., 0, :]

    @property
    def margin(self) -> str:
        """The hinge's margin, "hamming" or "zero_one" (model.margin)."""
        return self.hparams.margin

    @property
    def l2_grid(self) -> list[float]:
        """The lambdas: one, or a grid (model.l2=auto: resolved from the training set's size at fit start)."""
        if self._l2_grid is None:
            raise RuntimeError(f"{type(self).__name__}: model.l2=auto is set from the number of training examples "
                               f"when fitting starts; call resolve_l2(N) to use the learner outside Trainer.fit")
        return self._l2_grid

    def resolve_l2(self, num_examples: int) -> list[float]:
        """Set model.l2=auto to ``auto_l2 / num_examples``, at most ``max_auto_l2`` (a given l2 stays as it is);
        returns ``l2_grid``."""
        if self.hparams.l2 == "auto":
            l2 = self.auto_l2 / check_int(num_examples, "num_examples", 1)
            self._l2_grid = [l2 if self.max_auto_l2 is None else min(l2, self.max_auto_l2)]
        return self.l2_grid

    def regularizer(self) -> torch.Tensor:
        """lambda/2 ||w||^2 over the energy's weights (biases excluded)."""
        sq = sum((p.pow(2).sum() for n, p in self.energy.named_parameters() if not n.endswith("bias")),
                 torch.zeros((), device=self.device))
        return 0.5 * self.l2_grid[0] * sq

    # ------------------------------------------------------------------ certified solvers
    def smoothed_max(self) -> SmoothedMax | None:
        """The entropy-smoothed training max of solver="lbfgs" (None: not available for this learner).
        Default: exact ``tree_smoothed_max`` when training with ``tree_map`` on a tree or forest."""
        return tree_smoothed_max if self._exact_tree_training() else None

    def bcfw_oracle(self) -> Oracle | None:
        """The loss-augmented max oracle of solver="bcfw" (None: not available). Default: ``tree_oracle``."""
        return tree_oracle if self._exact_tree_training() else None

    def bcfw_step_oracle(self) -> Oracle | None:
        """A cheaper oracle for solver="bcfw"'s steps (``BCFW``'s ``step_oracle``; its certificate takes
        ``bcfw_oracle``). Default None: the steps take ``bcfw_oracle`` too."""
        return None

    @property
    def certificate_rows(self) -> int:
        """Training rows per batch of the BCFW certificate's pass over the training set (default 1024)."""
        return 1024

    @property
    def step_search_rows(self) -> int:
        """Rows per batch of a certificate's pass searching with ``bcfw_step_oracle`` (default ``certificate_rows``)."""
        return self.certificate_rows

    def _exact_tree_training(self) -> bool:
        return self._train_max is TRAIN_INFERENCE["tree_map"] and self.graph.is_forest

    @property
    def solver_name(self) -> str:
        """The solver that trains this learner ("auto" resolved against the current energy and graph)."""
        name = self.hparams.solver
        if name != "auto":
            return name
        certified = getattr(self.energy, "is_linear", False) and self.smoothed_max() is not None
        return "lbfgs" if certified else "adam"

    @property
    def bias_reg(self) -> float:
        """rho, the bias regulariser relative to l2 (model.bias_reg=auto: 1 for bcfw, else 1e-4)."""
        rho = self.hparams.bias_reg
        return (1.0 if self.solver_name == "bcfw" else 1e-4) if rho == "auto" else float(rho)

    def build_strategy(self) -> Strategy:
        """The training strategy (``structtorch.strategies``) of ``solver_name``; learners with an algorithm of
        their own (CRANK's CCCP, Domke's Algorithm 1) return theirs."""
        return solver_strategy(self, self.solver_name)

    @property
    def strategy(self) -> Strategy:
        """The training strategy, built on first use and again when the solver it stands for changes (a learned
        structure can turn "auto" from adam into lbfgs)."""
        if self._strategy is None or self._strategy.name != self.solver_name:
            self._strategy = self.build_strategy()
        return self._strategy

    def _full_model(self, g: int) -> int:
        """Index of lambda g's model on the whole training set (0 without a grid)."""
        return 0 if self.num_models is None else g * (self.hparams.cv_folds + 1) + self.hparams.cv_folds

    def cv_folds_of(self, num_examples: int) -> torch.Tensor:
        """The fold [N] of each training example (seeded, balanced)."""
        return fold_assignment(num_examples, self.hparams.cv_folds, seed=0)

    def grid_models(self, num_examples: int) -> tuple[float | torch.Tensor, torch.Tensor | None]:
        """(lambda per model [M], training mask [M, N]) of the regularisation grid (every fold of every lambda,
        then every lambda on the whole training set); (l2, None) without a grid."""
        if self.num_models is None:
            return self.l2_grid[0], None
        k = self.hparams.cv_folds
        fold = self.cv_folds_of(num_examples)
        masks = torch.stack([fold != f for f in range(k)] + [torch.ones(num_examples, dtype=torch.bool)])
        lam = torch.tensor(self.l2_grid, dtype=next(self.energy.parameters()).dtype).repeat_interleave(k + 1)
        return lam.to(self.device), masks.repeat(len(self.l2_grid), 1).to(self.device)

    def select_by_cv(self) -> dict[str, Any] | None:
        """Choose the grid's lambda by the mean held-out ``cv_metric`` of its fold models (training set
        only) and predict with its whole-training-set model; returns (and keeps) ``cv_report``."""
        if self.num_models is None:
            return None
        x, y = training_set(self.trainer)
        grid = self.l2_grid
        scores = self.cv_scores(self.energy, x, y, len(grid), self.hparams.cv_folds + 1).mean(1).tolist()
        best = max(range(len(grid)), key=lambda g: (scores[g], grid[g]))  # ties: the stronger l2
        self.selected_model.fill_(self._full_model(best))
        self.cv_report = {"metric": self.hparams.cv_metric, "folds": self.hparams.cv_folds, "l2": list(grid),
                          "scores": scores, "chosen_l2": grid[best]}
        return self.cv_report

    def cv_scores(self, energy: Energy, x: torch.Tensor, y: torch.Tensor, num_lambdas: int, stride: int
                  ) -> torch.Tensor:
        """Each example's held-out ``cv_metric`` under each of ``num_lambdas`` lambdas [G, N] (float64), from the
        batched ``energy`` whose model g * stride + f is lambda g trained without fold f (``cv_folds_of``) of x [N, D],
        y [N, n]: every example scored by the model that did not train on it."""
        fold, rows = self.cv_folds_of(len(x)), torch.arange(len(x))
        y_hat = self.all_predictions(energy, x, (self._predict,))[0]  # [M, N, n]
        return torch.stack([example_scores(self.hparams.cv_metric, y_hat[g * stride + fold, rows], y)
                            for g in range(num_lambdas)])

    @staticmethod
    def all_predictions(energy: Energy, x: torch.Tensor, decoders: tuple[Callable[[Potentials], torch.Tensor], ...]
                        ) -> list[torch.Tensor]:
        """Every model's prediction of every row of x [N, D] by each decoder: [M, N, n] per decoder (on the CPU),
        from one pass of the batched ``energy`` over x."""
        weight = next(energy.parameters())
        out: list[list[torch.Tensor]] = [[] for _ in decoders]
        with torch.no_grad():
            for i in torch.arange(len(x)).split(1024):
                pot = energy(x[i].to(weight.device, weight.dtype))
                for predicted, decode in zip(out, decoders):
                    predicted.append(decode(pot).cpu())
        return [torch.cat(p, -2) for p in out]

    def on_fit_start(self) -> None:
        x, y = training_set(self.trainer)
        state = self._strategy_state if (self._strategy_state or {}).get("kind") == self.strategy.name else None
        with phase(f"{type(self).__name__} ({self.strategy.name}): set-up", quiet=True):
            self.strategy.setup(x, y, state)  # a checkpoint of another strategy: this one starts from its weights
        self._first_epoch = self.current_epoch

    def on_train_epoch_start(self) -> None:
        """A progress phase per epoch (its start logged for the fit's first epoch), then the strategy's."""
        self._epoch_phase.close()
        name = f"{type(self).__name__} ({self.strategy.name}), epoch {self.current_epoch + 1}"
        self._epoch_phase.enter_context(phase(name, quiet=self.current_epoch != self._first_epoch))
        self.strategy.epoch_start()

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor | None:
        return self.strategy.training_step(batch, batch_idx)

    def on_train_epoch_end(self) -> None:
        if self.strategy.epoch_end():
            self.trainer.should_stop = True
        elif self.trainer.strategy.reduce_boolean_decision(out_of_time(distributed=True) or self.strategy.reserved,
                                                           all=False):
            self.stopped_by = "time_budget"  # every process stops at this epoch's end (any one out of time)
            self.trainer.should_stop = True
        self._epoch_phase.close()

    def training_cap(self) -> str:
        """What ended training before a certificate or stopping rule: "trainer.time_budget" (the run's wall-clock
        budget, ``progress.time_budget``) or "trainer.max_epochs=<n>"."""
        if self.stopped_by == "time_budget":
            return "trainer.time_budget"
        return f"trainer.max_epochs={self.trainer.max_epochs if self._trainer is not None else '?'}"

    def solver_report(self) -> dict[str, Any]:
        """How training ended, for metrics.json: the solver, (certified solvers) its last certificate and the l2
        it trained with."""
        report = self.strategy.report() | ({"l2": self.l2_grid} if self._l2_grid is not None else {})
        return report | ({"stopped_by": self.stopped_by} if self.stopped_by else {})

    # ------------------------------------------------------------------ structure
    @property
    def label_names(self) -> list[str]:
        return list(self.hparams.label_names or [f"y{i}" for i in range(self.hparams.num_labels)])

    @property
    def graph(self) -> Graph:
        """The label graph the learner predicts on."""
        return self.energy.graph

    def set_structure(self, mask: torch.Tensor) -> None:
        """Restrict the energy to the edges where ``mask`` [E] (bool, over the candidate graph) is True and
        keep the mask (checkpointed). Call before the optimizer exists, or (a learner whose certified solver
        trains other parameters, e.g. CRANK) where the optimizer steps nothing."""
        mask = torch.as_tensor(mask, dtype=torch.bool).detach().cpu()
        self.energy.restrict(mask)
        self.structure_mask = mask.to(self.structure_mask.device)

    def reset_structure(self) -> None:
        """Back to the candidate graph: a new energy from ``build_energy()`` (fresh weights), no mask."""
        self.energy = self.build_energy().to(self.device)
        self.structure_mask = torch.zeros(0, dtype=torch.bool, device=self.structure_mask.device)

    def structure_weights(self) -> torch.Tensor | None:
        """Weight per edge of ``self.graph`` [E] shown in structure pictures (the energy's pairwise weights)."""
        w = self.energy.pairwise_weights()
        if w is not None and self.num_models is not None:
            w = w[int(self.selected_model)]
        return None if w is None else w.detach().float().cpu()

    def structure_summary(self) -> dict[str, Any]:
        """The learned structure by label name, for metrics.json: ``{"edges": [[a, b, weight], ...], ...}``."""
        names, w = self.label_names, self.structure_weights()
        edges = self.graph.edges.reshape(-1, 2).tolist()
        weights = [None] * len(edges) if w is None else w.reshape(-1).tolist()
        summary = {"num_edges": len(edges), "is_forest": bool(self.graph.is_forest),
                   "edges": [[names[a], names[b], None if v is None else round(v, 6)]
                             for (a, b), v in zip(edges, weights)]}
        candidates = self.candidate_graph()
        if candidates is not None:
            summary["candidates"] = {"num_edges": candidates.num_edges,
                                     "edges": [[names[a], names[b]] for a, b in candidates.edges.tolist()]}
        return summary

    def structure_figure(self):
        """A matplotlib Figure of the learned label structure (labels by name, edges weighted)."""
        return structure_figure(self.graph, self.structure_weights(), self.label_names,
                                title=f"{type(self).__name__}: {self.graph.num_edges} edges "
                                      f"(width = |weight|, red > 0, blue < 0)")

    def per_label_summary(self) -> dict[str, Any]:
        """The last test run's accuracy, F1 and support of every label by name, for metrics.json."""
        stats = self.test_per_label
        return {name: {"accuracy": float(stats["accuracy"][i]), "f1": float(stats["f1"][i]),
                       "support": int(stats["support"][i])} for i, name in enumerate(self.label_names)}

    def per_label_figure(self):
        """A matplotlib Figure of the last test run's per-label accuracy and F1."""
        return per_label_figure(self.test_per_label, self.label_names, f"{type(self).__name__}: per-label test")

    def test_figures(self) -> dict[str, Any]:
        """The pictures of the last test run, by file name (the CLI saves them in the run directory)."""
        return {"per_label.png": self.per_label_figure()}

    def _log_figure(self, tag: str, fig) -> None:
        """Add ``fig`` to TensorBoard (when that is the logger) and close it."""
        if isinstance(self.logger, L.pytorch.loggers.TensorBoardLogger) and self.trainer.is_global_zero:
            self.logger.experiment.add_figure(tag, fig, self.global_step)
        close_figure(fig)

    def setup(self, stage: str) -> None:
        """Before fitting: set model.l2=auto from the training set's size, learn the structure from the training set
        (once; a loaded checkpoint keeps its own)."""
        if stage != "fit":
            return
        x, y = training_set(self.trainer)
        if self.hparams.l2 == "auto":
            l2 = self.resolve_l2(len(x))[0]
            capped = f" (capped at {self.max_auto_l2:g})" if l2 < self.auto_l2 / len(x) else ""
            rank_zero_info(f"model.l2=auto: lambda = {self.auto_l2:g} / {len(x)} training examples = {l2:.4g}{capped}")
        if not self.structure_mask.numel() and not self.candidate_edges.numel():
            candidates = self.build_candidates(x, y)
            if candidates is not None and not torch.equal(candidates.edges, self.graph.edges):
                self.set_candidates(candidates)
                n = candidates.num_nodes
                rank_zero_info(f"{type(self).__name__}: candidate graph of {candidates.num_edges} of the "
                               f"{n * (n - 1) // 2} label pairs")
        if self.structure_mask.numel() or type(self).build_structure is StructuredLearner.build_structure:
            return
        with phase(f"{type(self).__name__} structure ({len(y)} training examples)"), budget_share(STRUCTURE_SHARE):
            mask = self.build_structure(x, y)
        if mask is not None:
            self.set_structure(mask)

    #: attributes that report what the fit's set-up learned or chose (metrics.json), kept in checkpoints so that a
    #: resumed run reports them too
    set_up_reports: tuple[str, ...] = ("cv_report",)

    def restore_set_up(self, path: str) -> None:
        """Before ``trainer.fit(self, ..., ckpt_path=path)`` (the CLI's resume): take the checkpoint's structure, the
        learner's choices and weights now. Lightning restores a checkpoint only after ``setup``, so a resumed fit
        would otherwise learn its structure and make its choices again (RTA's feature map CV: 85 s on delicious),
        then drop them for the checkpoint's; with them taken, ``setup`` keeps them (``restored``)."""
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        self.on_load_checkpoint(checkpoint)
        self.load_state_dict(checkpoint["state_dict"])
        self.restored = True

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = self._strategy.state_dict() if self._strategy is not None else self._strategy_state
        checkpoint["structtorch"] = {"learner": type(self).__name__, "solver": state,
                                     **{name: getattr(self, name) for name in self.set_up_reports}}
        weights = checkpoint.get("state_dict", {})
        for name, value in (self._strategy.checkpoint_weights() if self._strategy is not None else {}).items():
            weights[f"energy.{name}"] = value.detach().to(weights[f"energy.{name}"])

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Re-apply the checkpoint's structure before its weights are loaded (shapes must match); keep the
        strategy's state for the fit start."""
        saved = checkpoint.get("structtorch", {})
        self._strategy_state = saved.get("solver")
        for name in self.set_up_reports:
            if saved.get(name) is not None:
                setattr(self, name, saved[name])
        edges = checkpoint.get("state_dict", {}).get("candidate_edges")
        if edges is not None and edges.numel() and not torch.equal(edges.cpu(), self.candidate_edges.cpu()):
            self.set_candidates(Graph(self.hparams.num_labels, edges.cpu()))
        saved = checkpoint.get("state_dict", {}).get("structure_mask")
        saved = torch.zeros(0, dtype=torch.bool) if saved is None else saved.cpu()
        if torch.equal(saved, self.structure_mask.cpu()):
            return
        if self.structure_mask.numel():  # another structure was set: start over from the candidate graph
            self.reset_structure()
        if saved.numel():
            self.set_structure(saved)

    # ------------------------------------------------------------------ prediction
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted labels y_hat [B, n] for inputs x [B, D] (a grid: by the selected model)."""
        return self._predict(self.potentials(x))

    def potentials(self, x: torch.Tensor) -> Potentials:
        """The energy's potentials of x [B, D]; with a regularisation grid, the selected model's only."""
        pot = self.energy(x)
        if self.num_models is None:
            return pot
        m = int(self.selected_model)
        return Potentials(pot.unary[m], pot.pairwise[m], pot.graph)

    # ------------------------------------------------------------------ Lightning hooks
    def _evaluate(self, batch: tuple[torch.Tensor, ...], metrics) -> torch.Tensor:
        x, y = batch[0], batch[1]
        y_hat = self(x)
        metrics.update(y_hat, y)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(x))
        return y_hat

    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def on_validation_epoch_end(self) -> None:
        if "val/hamming_acc" in self.trainer.callback_metrics and not self.trainer.sanity_checking:
            self.log("hp_metric", self.trainer.callback_metrics["val/hamming_acc"])

    def test_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self.per_label.update(self._evaluate(batch, self.test_metrics), batch[1])

    def on_test_epoch_start(self) -> None:
        self.per_label.reset()

    def on_test_epoch_end(self) -> None:
        self.test_per_label = {k: v.cpu() for k, v in self.per_label.compute().items()}
        self._log_figure("test/per_label", self.per_label_figure())

    def on_train_end(self) -> None:
        self.strategy.train_end()
        warning = self.strategy.warning()
        if warning is not None:
            rank_zero_warn(warning)
        report = self.select_by_cv()
        if report is not None and self.logger is not None and self.trainer.is_global_zero:
            for l2, score in zip(report["l2"], report["scores"]):
                self.logger.log_metrics({f"cv/{report['metric']}/l2={l2:g}": score}, step=self.global_step)
            self.logger.log_metrics({"cv/chosen_l2": report["chosen_l2"]}, step=self.global_step)
        self._log_figure("structure", self.structure_figure())

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x)

    def configure_optimizers(self):
        if self.num_models is not None and getattr(self.energy, "num_models", None) != self.num_models:
            raise ValueError(f"model.l2={list(self.l2_grid)} is a grid of {self.num_models} batched models, but "
                             f"{type(self).__name__}.build_energy() did not pass num_models=self.num_models to its "
                             f"energy")
        strategy = self.strategy
        strategy.check()
        self.automatic_optimization = strategy.automatic
        return strategy.configure_optimizers()


def training_set(trainer: L.Trainer | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole training set (x [N, D], y [N, n]) of the trainer's datamodule (or its train loader)."""
    dm = getattr(trainer, "datamodule", None)
    if dm is not None and hasattr(dm, "train_tensors"):
        return dm.train_tensors
    loader = getattr(trainer, "train_dataloader", None) if trainer is not None else None
    if loader is None and dm is not None:
        loader = dm.train_dataloader()
    if loader is None:
        raise RuntimeError("this learner learns its structure from the training data: fit it with a datamodule "
                           "that has `train_tensors` or a train dataloader of (x, y[, index]) batches")
    batches = list(loader)
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def _check_l2(l2: Any) -> list[float] | None:
    """The lambdas of model.l2 (a number >= 0 or a non-empty list of them), or None for "auto"."""
    if l2 == "auto":
        return None
    values = [l2] if isinstance(l2, (int, float, str)) else list(l2)  # a number, or a list / ListConfig
    what = "'auto', a number >= 0 or a non-empty list of numbers"
    if not values:
        raise ValueError(f"l2 must be {what}, got {l2!r}")
    return [check_float(v, "l2", 0.0, strict=False, expected=what) for v in values]


def _lookup(what: str | Callable, registry: dict[str, Callable], name: str) -> Callable:
    if callable(what):
        return what
    if what not in registry:
        raise ValueError(f"{name} must be one of {sorted(registry)} or a callable, got {what!r}")
    return registry[what]
