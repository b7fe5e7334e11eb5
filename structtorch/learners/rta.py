"""RTA: multilabel max-margin learning on an ensemble of random spanning trees (Marchand, Su, Morvant, Rousu,
Shawe-Taylor, NIPS 2014).

T spanning trees of the complete label graph are drawn uniformly (Pruefer sequences) from ``seed``; each tree
has its own weights on the joint features varphi(x) kron psi_ij(y_i, y_j) of its edges
(``TreeEnsembleEnergy``), and the ensemble scores F(x, y) = (1/T) sum_t <w_t, phi_hat_t(x, y)>. Training
solves the primal of Def. 6,

    min_w  lambda/2 sum_t |w_t|^2 + (1/N) sum_k max(0, 1 - (F(x_k, y_k) - max_{y != y_k} F(x_k, y))),

(Def. 6 with slack weight C is this with lambda = 1 / (C N T^2)) by BCFW with a duality gap, the worst
violator of each example from ``ensemble_map(..., exclude=y_k)`` (Sec. 4.1: K-best lists on every tree,
Lemma 7's certificate, K doubled up to ``k_max`` where it fails; above ``MANY_LABELS`` labels the steps
keep K = k): ``margin="zero_one"``. Up to ``exact_labels`` labels (default 22) every search scores all 2^n labellings
instead (``ensemble_enumerate``, meet in the middle): exact, so the duality gap is too.
The default is ``margin="hamming"``: the margin rescaled by the Hamming distance (the loss-augmented max is then
``ensemble_map`` on Hamming-augmented potentials), the variant that reproduces the paper's microlabel losses on
emotions and yeast here (experiments/results/rta_table1.md) and that was better than Def. 6's on every dataset and
shape measured, 6 to 983 labels, but one where it was within a point (README, RTA). Prediction is
``ensemble_map`` with the same adaptive K.

Logged: the fraction of training (per epoch), validation and test examples whose inference Lemma 7
certified, and the mean K used; the ensemble's edge frequencies as a picture.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torchmetrics import MeanMetric

from ..energies import FEATURE_MAPS, LinearTableEnergy, TreeEnsembleEnergy
from ..folds import fold_assignment
from ..graph import Graph, check_bool, check_float, check_int
from ..inference import ensemble_map, tree_max_marginals
from ..inference.kbest import MAX_ENUMERATED
from ..losses import total_score
from ..metrics import selection_scores
from ..plots import heatmap_figure
from ..potentials import Potentials
from ..progress import budget_share, out_of_time, phase, tick
from ..solvers import BCFW, EnsembleOracle, Oracle
from ..solvers.dcd import independent_svms
from ..structure import random_spanning_trees
from .base import START_SHARE, StructuredLearner, training_set

#: trees x labels x k_max elements of the K-best searches per batch of the certificate's pass (measured at
#: delicious, 26 rows of 10 trees x 983 labels x K = 32: 1.2 GB)
SEARCH_ELEMENTS = 2**23

#: Above this many labels RTA counts as many-labelled: model.l2=auto is scaled by the rows' mean label count
#: (``RTA.auto_l2``) and BCFW's steps search K-best lists of k without doubling K (``RTA.bcfw_step_oracle``).
MANY_LABELS = 22
#: model.exact_labels at most: the labels whose 2^n labellings ``ensemble_enumerate`` scores
EXACT_MAX_LABELS = MAX_ENUMERATED.bit_length() - 1

# model.margin: the Hamming margin is the default at every label count. Measured against Def. 6's 0/1 margin with the
# defaults otherwise (README, RTA: the table of shapes from genbase's 27 labels to delicious' 983): better on both
# scores everywhere but corel5k's shape, within a point there; from w = 0 (before the start at Independent's
# solution) the Hamming hinge had predicted almost no label at medical's and bibtex's shapes.

#: model.l2=auto is anchored at this many trees and scales as 1 / T (``RTA.auto_l2``): the ensemble scores the mean of
#: its T trees' scores, so a score function costs T times the l2 at T times the trees (each tree must carry it). On
#: emotions (rta_table1, 5 folds, Hamming margin), 40 trees at 10 trees' lambda (2.1e-4) had 20.09 / 71.33 microlabel
#: / 0-1 loss, at a quarter of it 19.70 / 70.48 (10 trees: 19.33 / 69.80), at twice it 22.46 / 80.11.
AUTO_L2_TREES = 10

#: normalize="auto": the feature maps compared by a 3-fold CV of Independent's SVMs on the training rows, by held-out
#: subset accuracy plus example F1. On 2,000 of tmc2007's 19,367 rows it chose "global", on all of them "row" (as
#: Independent on the test file: 25.4 / 60.7 subset / F1 against 24.8 / 60.0; RTA 26.2 / 62.0 against 24.4 / 60.6).
FEATURE_CV_FOLDS = 3

#: interaction_l2="auto": the candidates (interaction_l2, factor on model.l2=auto) ``choose_interaction`` compares: the
#: paper's joint features at the default lambda, and no input-dependent interaction at a tenth of it. Measured (test
#: subset / example F1, README, RTA): at enron's shape (``scripts/mulan_like.py``) 60.97 / 91.09 and 68.05 / 92.91
#: (Independent 67.18 / 92.70); emotions 29.70 / 59.95 and 26.24 / 62.31, flags 21.54 / 74.10 and 10.77 / 69.37,
#: scene 64.72 / 69.62 and 64.88 / 70.60. The second alone at the default lambda: 58.55 at enron's shape.
INTERACTION_CANDIDATES = ((1.0, 1.0), (math.inf, 0.1))
#: ``choose_interaction``'s CV: folds, each fold's relative gap and BCFW epochs at most, and the share of the time left
#: for each candidate
INTERACTION_CV_FOLDS, INTERACTION_CV_TOL, INTERACTION_CV_EPOCHS, INTERACTION_CV_SHARE = 3, 0.05, 1000, 0.1
#: ``choose_interaction``'s CV runs only where the training rows are at most this many; above, the paper's features
#: stay without a CV. On a subset the one-tree fits do not see how slowly the ensemble's fit on all rows converges at
#: the smaller lambda (mediamill's shape, 27,894 rows: the CV on 2,000 chose a tenth of lambda, and the fit ended the
#: budget 18 subset points below the paper's model); and on delicious and tmc2007 it took 86-102 s of their budgets
#: to choose the paper's features.
INTERACTION_CV_ROWS = 2000
#: ``choose_interaction`` leaves the paper's candidate only for one whose held-out score per row beats it by more than
#: this many standard errors of the paired difference. The fits are cut by time, so z moves with the machine's load
#: (genbase's shape: 2.11 alone, 1.31 beside two other jobs); at 1.645 (a one-sided 5% test) medical's and genbase's
#: shapes left the paper's features at z 2.72 and 1.97 for test scores 1-2 points lower (README, RTA), while enron's
#: shape, where they cost 6 subset points, had z 6.07-7.64 and real data z 0.26 (flags) or below.
INTERACTION_CV_Z = 3.0

__all__ = ["AUTO_L2_TREES", "EDGE_L2", "MANY_LABELS", "INTERACTION_CANDIDATES", "MAM",
           "RTA"]


class RTA(StructuredLearner):
    """Random Tree Approximation: a max-margin ensemble of ``num_trees`` random spanning trees.

    Args:
        num_trees: T, the number of uniform random spanning trees (paper: up to 40).
        k: the K-best list length of the ensemble inference (Sec. 4.1).
        k_max: K doubles up to k_max for the examples Lemma 7 does not certify, in prediction and in the
            certificate's pass, and in BCFW's steps up to ``MANY_LABELS`` labels (above, they search with k
            alone: ``bcfw_step_oracle``). None: max(k, min(2 n, 32)) (the paper's K went up to 32).
        exact_labels: up to this many labels every search (training's, the certificate's, prediction's) scores all
            2^n labellings instead (``ensemble_enumerate``): the exact maximiser, so every search is certified and
            the duality gap is exact; above it the K-best lists with Lemma 7 (the paper's). 0: always K-best.
            Per row (``scripts/bench_kbest.py --exact``: 10 random trees, one thread, the K-best search on the fused
            kernel) the enumeration took 0.032 ms at 14 labels (yeast) against the K-best search's 0.28 (doubling K
            to 28 where Lemma 7 left 75% of the rows uncertified), 0.15 ms against 0.47 at 19 (birds), 0.56 ms
            against 0.67 at 22 (tmc2007).
        seed: the seed the trees are drawn from (kept in the checkpoint with the trees).
        normalize: varphi(x) of the joint features (``TreeEnsembleEnergy``): "row" (or True) x / |x|, the paper's
            phi_hat; "global" x over the training rows' root mean squared norm; False x as given; "auto" (default):
            "row" or "global", whichever gives Independent's SVMs on varphi(x) (at lambda n T / 4, as ``dual_start``)
            the better held-out subset accuracy plus example F1 in a 3-fold CV of the training rows
            (``choose_feature_map``). Measured (Independent on the test files, subset / F1): "row" is better on dense
            features (scene 55.9 / 62.0 against 48.9 / 55.0, emotions 26.7 / 57.7 against 24.3 / 54.0), "global" on
            standardised sparse binary ones, whose rare columns dominate |x| (enron's shape 75.5 / 82.6 against
            68.6 / 75.4, bibtex's 85.4 / 89.3 against 80.8 / 85.9).
        margin: "hamming" (the default: margin = Hamming distance) or "zero_one" (Def. 6: margin 1 against the
            worst violator). The Hamming margin was better on every dataset and shape measured, 6 to 983 labels,
            but one where it was within a point (README, RTA).
        l2: lambda above (a number, or a grid chosen by CV); "auto" (default): ``auto_l2`` / N with
            ``auto_l2`` = 2.5 / (n-1)^2 at T = 10 trees (0.1 at n = 6 labels: 1e-4 at N = 1000, rta_table1's
            protocol), times 10 / T.
        bias_reg: the biases' regulariser relative to l2: 1, a constant input of the same norm as varphi(x)
            (much smaller values make BCFW's steps crawl along the bias).
        independent_start: BCFW starts at the dual point of Independent's solution (``dual_start``), not at w = 0.
        interaction_l2: the l2 weight of each edge table's input-dependent interaction part relative to the rest
            (``TreeEnsembleEnergy``): 1 is the paper's joint features; inf keeps only input-dependent terms
            in y_i and in y_j (sums of node terms) and the biases' input-independent interactions; "auto": one of
            ``INTERACTION_CANDIDATES`` (with model.l2=auto, each with its factor on lambda) by a CV of one tree
            (``choose_interaction``; the default: up to ``INTERACTION_CV_ROWS`` training rows, above them 1 without
            a CV; on every Mulan set of the matrix with a CV it keeps 1, README, RTA). Measured at
            enron's shape (``scripts/mulan_like.py --shape enron --cardinality 3.38``, labels that follow their
            keywords independently), one tree (exact inference), lambda 3.1e-6: subset / example F1 61.83 / 91.81 at
            1, 67.70 / 92.98 at inf (Independent 67.18 / 92.70); 10 trees at 0.1 times model.l2=auto: 61.83 / 91.17
            at 1, 68.05 / 92.91 at inf. On the test files of emotions, scene, flags, yeast and birds 1 had the
            better example F1 on all five and subset accuracy on all but birds (README, RTA).
        Other args as ``StructuredLearner``. The solver is BCFW (certified) by default; adam/sgd run the same
        hinge by gradient steps.
    """

    #: the start's and ``choose_feature_map``'s DCD epochs at most: at lambda n T / 4 with model.l2=auto their C is
    #: about 1.6 n / T, and DCD's epochs to a given gap grow with C (delicious' top labels, 2,000 rows, 1% gap: 45
    #: epochs at 32 labels, 90 at 64, 175 at 128, 350 at 256, 655 at 512), so without a cap the set-up grew as n^2
    #: (bench_scale, 512 labels: 168 s of a 269 s cell). Up to about 64 labels the fits end by their tolerance first.
    start_epochs = 100

    @property
    def auto_l2(self) -> float:
        """model.l2=auto: lambda = 2.5 / ((n-1)^2 N) with the Hamming margin up to ``MANY_LABELS`` labels,
        0.1 / N up to 6 labels. Unit-norm joint features spread over the n-1 edges of each tree, and the Hamming
        margin grows with n, so the weight a lambda gives the margins falls with n: the best lambda N on validation
        splits (70/30 of the training file) fell from about 0.03-0.1 at 6-7 labels (emotions, flags) to 0.015 at 14
        (yeast) and under 0.008 at 19 (birds, where 0.1 trained a model predicting no label). Anchored at
        rta_table1's 1e-4 for N = 1000 and 6 labels; not extrapolated upwards below 6 labels (no evidence there).
        All of it at ``AUTO_L2_TREES`` = 10 trees (the default), times 10 / T at T trees.

        With Def. 6's margin, or above ``MANY_LABELS`` labels, times the training rows' mean label count c
        (``label_cardinality``, at least 1). In the dual a violator flipping d labels adds d to the linear term under
        the Hamming margin and 1 under Def. 6, against about d in the quadratic term (its joint features) in both:
        the same balance needs lambda N about d times larger, and a row's violators flip about as many labels as it
        has. Delicious (983 labels, c = 19), test subset / example F1: 0.00 / 13.62 at the Hamming rule (its last
        iterate swinging between epochs: validation F1 24.3, 24.5, 14.0), 0.00 / 21.28 at c times it, 23.70 at 45
        times, 24.43 at 100 times; medical's shape (45 labels, c = 1.24, ``scripts/mulan_like.py``) 50.23 / 58.87 at
        1 times, 46.82 / 56.04 at 2 times. With the Hamming margin above ``MANY_LABELS`` labels too: at
        cal500's shape (174 labels, c = 26) 0.00 / 48.71 at 1 times (predicting the labels about as often as they
        occur: an overfit), 0.00 / 55.52 at c times; at enron's (53, c = 3.4) 61.83 / 91.41 and 61.66 / 91.25."""
        n = self.hparams.num_labels
        scale = 1.0 if self.margin == "hamming" and n <= MANY_LABELS else max(1.0, self.label_cardinality)
        return 2.5 * scale / max(n - 1, 5) ** 2 * AUTO_L2_TREES / self.hparams.num_trees

    def __init__(self, num_features: int, num_labels: int, num_trees: int = 10, k: int = 8,
                 k_max: int | None = None, exact_labels: int = 22, seed: int = 0, normalize: bool | str = "auto",
                 margin: str = "hamming", l2: float | list[float] | str = "auto", bias_reg: float = 1.0,
                 independent_start: bool = True, interaction_l2: float | str = "auto", **kwargs) -> None:
        for name, v, low in (("num_trees", num_trees, 1), ("k", k, 1), ("num_labels", num_labels, 2)):
            check_int(v, f"RTA: {name}", low)
        check_bool(independent_start, "RTA: independent_start")
        if interaction_l2 != "auto":
            check_float(interaction_l2, "RTA: interaction_l2", 0.0, expected="a number > 0 (inf: no input-dependent "
                        "interaction) or 'auto'")
        k_max = max(k, min(2 * num_labels, 32)) if k_max is None else k_max
        check_int(k_max, "RTA: k_max", k, expected=f"an int >= k={k}")
        check_int(exact_labels, "RTA: exact_labels", 0, expected=f"an int in [0, {EXACT_MAX_LABELS}]")
        if exact_labels > EXACT_MAX_LABELS:
            raise ValueError(f"RTA: exact_labels scores 2^n labellings per search, at most n = {EXACT_MAX_LABELS}: "
                             f"got {exact_labels}")
        self._trees = random_spanning_trees(num_labels, num_trees, torch.Generator().manual_seed(seed))
        super().__init__(num_features, num_labels, margin=margin, l2=l2, bias_reg=bias_reg, **kwargs)
        self.save_hyperparameters({"k_max": k_max, "independent_start": independent_start})
        self.oracle = EnsembleOracle(k, k_max, num_labels <= exact_labels)  # the certificate's; counts the searches
        self.step_oracle = EnsembleOracle(k, k) if num_labels > MANY_LABELS else None  # bcfw_step_oracle
        self._train_max = self._ensemble_max  # margin="hamming" with a gradient solver
        self._predict = lambda pot: self.search(pot)[0]  # also the CV grid's
        self.certified = nn.ModuleDict({"val": MeanMetric(), "test": MeanMetric()})
        self.mean_k = nn.ModuleDict({"val": MeanMetric(), "test": MeanMetric()})
        self.feature_choice: dict[str, Any] | None = None  # choose_feature_map's report
        self.interaction_choice: dict[str, Any] | None = None  # choose_interaction's report (kept in checkpoints)
        self.label_cardinality = 1.0  # the training rows' mean label count (``auto_l2``), set in fit

    def build_energy(self) -> TreeEnsembleEnergy:
        normalize = "row" if self.hparams.normalize == "auto" else self.hparams.normalize  # until the fit chooses
        interaction_l2 = 1.0 if self.hparams.interaction_l2 == "auto" else self.hparams.interaction_l2  # until chosen
        return TreeEnsembleEnergy(self.hparams.num_features, self._trees, normalize=normalize,
                                  num_models=self.num_models, interaction_l2=interaction_l2)

    def setup(self, stage: str) -> None:
        """Fitting: the training rows' ``label_cardinality`` (for model.l2=auto), the base's
        set-up, then (normalize="auto") ``choose_feature_map`` and (interaction_l2="auto") ``choose_interaction`` on
        the training set. A resumed fit's checkpoint then restores the map, the interactions and lambda it trained
        with; taken before the fit (``restore_set_up``, the CLI's resume), no CV runs again."""
        if stage != "fit":
            return super().setup(stage)
        x, y = training_set(self.trainer)  # once here (a plain train loader is read whole at each call)
        self.label_cardinality = float(y.sum(1, dtype=torch.float64).mean())
        n = self.hparams.num_labels
        rank_zero_info(f"RTA: exact inference, every labelling of the {n} labels scored (model.exact_labels="
                       f"{self.hparams.exact_labels})" if self.exact else
                       f"RTA: K-best inference (k {self.hparams.k} doubled to {self.hparams.k_max}, Lemma 7's "
                       f"certificate) above model.exact_labels={self.hparams.exact_labels} labels")
        super().setup(stage)
        if self.restored:  # the checkpoint's feature map (its buffers), interactions and lambda (``restore_set_up``)
            if self.interaction_choice is not None:  # again: the base's set-up resolved model.l2=auto afresh
                self.take_interaction_choice(self.interaction_choice)
            return
        if self.hparams.normalize == "auto":
            self.feature_choice = self.choose_feature_map(x, y)
        elif self.energy.feature_map == "global":
            self.energy.set_feature_map("global", x)
        if self.hparams.interaction_l2 == "auto":
            self.interaction_choice = self.choose_interaction(x.to(self.fit_device), y.to(self.fit_device))

    def choose_feature_map(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any] | None:
        """Set varphi to "row" or "global", whichever gives Independent's SVMs on varphi(x) at lambda n T / 4 (the
        start's problem, ``dual_start``) the larger mean held-out ``SELECTION_METRICS`` (summed) in a
        ``FEATURE_CV_FOLDS``-fold CV of the training rows x [N, D], y [N, n] (relative gap 0.05, a tenth of the time
        left for each map); ties: "row". Returns the scores and the choice, or None (the map stays "row") where
        Independent's kernel cannot be built."""
        energy, T, n = self.energy, self.trees.num_graphs, self.hparams.num_labels
        fold = fold_assignment(len(x), FEATURE_CV_FOLDS, seed=0).to(x.device)
        masks = torch.stack([fold != f for f in range(FEATURE_CV_FOLDS)])
        grid = self.l2_grid
        lam = torch.full((FEATURE_CV_FOLDS,), grid[len(grid) // 2] * n * T / 4, dtype=torch.float64)
        scores = {}
        with phase(f"RTA feature map: {FEATURE_CV_FOLDS}-fold CV of Independent"):
            for name in ("row", "global"):
                energy.set_feature_map(name, x if name == "global" else None)  # the rms norm only where used
                phi = energy.features(x.to(torch.float64))
                with budget_share(START_SHARE / 2):  # about the same time for each
                    fitted = independent_svms(phi, y, lam, masks, bias_reg=self.bias_reg, tol=0.05,
                                              max_epochs=self.start_epochs)
                if fitted is None:
                    energy.set_feature_map("row")
                    return None
                w, b, _ = fitted  # [F, n, D], [F, n]
                held_out = [(phi[fold == f] @ w[f].T + b[f]).gt(0).long() for f in range(FEATURE_CV_FOLDS)]
                truth = [y[fold == f] for f in range(FEATURE_CV_FOLDS)]
                scores[name] = float(selection_scores(torch.cat(held_out), torch.cat(truth)).mean())
        chosen = max(("row", "global"), key=lambda name: (scores[name], name == "row"))
        energy.set_feature_map(chosen)
        rank_zero_info(f"RTA: normalize=auto chose varphi = {chosen!r} (held-out subset accuracy + example F1 of "
                       f"Independent: row {scores['row']:.4f}, global {scores['global']:.4f})")
        return {"chosen": chosen, "scores": scores, "folds": FEATURE_CV_FOLDS}

    def choose_interaction(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        """interaction_l2="auto": set interaction_l2 (and with model.l2=auto, lambda times its factor) to an entry of
        ``INTERACTION_CANDIDATES`` by an ``INTERACTION_CV_FOLDS``-fold CV of one tree on the training rows x [N, D],
        y [N, n] (``held_out_one_tree``), scored per row by held-out ``SELECTION_METRICS`` (summed). The paper's (the
        first) stays unless another beats it by more than ``INTERACTION_CV_Z`` standard errors of the paired
        difference (then the best-scoring such), and stays without a CV above ``INTERACTION_CV_ROWS`` rows. The fits
        stop at the time share ``INTERACTION_CV_SHARE`` each, certified or not (reported): a smaller lambda fits more
        slowly, so a cut-off fit plays against it. One tree at T times the ensemble's lambda regularises a function of
        the labels as the T trees do (each tree carries all of the ensemble's mean), and its search is exact. Returns
        the scores, z, certified, and the choice (or why no CV ran)."""
        grid, auto, T = self.l2_grid, self.hparams.l2 == "auto", self.trees.num_graphs
        if len(x) > INTERACTION_CV_ROWS:
            why = (f"{len(x)} training rows > INTERACTION_CV_ROWS={INTERACTION_CV_ROWS}: a CV on a subset does not see "
                   f"how slowly the fit on all rows converges at a smaller lambda")
            rank_zero_info(f"RTA: interaction_l2=auto keeps the paper's features (1) without a CV ({why})")
            return {"chosen": "1", "l2": grid, "no_cv": why}
        fold = fold_assignment(len(x), INTERACTION_CV_FOLDS, seed=0).to(x.device)
        lam = grid[len(grid) // 2]
        per_row, certified = {}, {}  # held-out subset accuracy + example F1 per row [N]; fits certified
        with phase(f"RTA interaction_l2=auto: {INTERACTION_CV_FOLDS}-fold CV of one tree"):
            for r, factor in INTERACTION_CANDIDATES:
                with budget_share(INTERACTION_CV_SHARE):
                    y_hat, certified[r] = self.held_out_one_tree(x, y, r, T * lam * (factor if auto else 1.0), fold)
                per_row[r] = selection_scores(y_hat, y)
        paper, scores = per_row[INTERACTION_CANDIDATES[0][0]], {r: float(v.mean()) for r, v in per_row.items()}
        z = {r: float((v - paper).mean() / (v - paper).std().div(len(v) ** 0.5).clamp_min(1e-12)) for r, v in
             per_row.items()}  # the paired difference to the paper's in standard errors
        better = [c for c in INTERACTION_CANDIDATES if z[c[0]] > INTERACTION_CV_Z]
        chosen, factor = max(better, key=lambda c: scores[c[0]]) if better else INTERACTION_CANDIDATES[0]
        self.energy.set_interaction_l2(chosen)
        if auto:
            self._l2_grid = [lam * factor]
        lam_note = f" and lambda {lam * factor:.4g}" if auto else ""
        found = ", ".join(f"{r:g} {v:.4f} (z {z[r]:.2f}{'' if certified[r] else ', not certified'})"
                          for r, v in scores.items())
        rank_zero_info(f"RTA: interaction_l2=auto chose {chosen:g}{lam_note} (held-out subset accuracy + example F1 "
                       f"of one tree: {found}; 1 is left only at z > {INTERACTION_CV_Z:g})")
        return {"chosen": f"{chosen:g}", "l2": self.l2_grid, "folds": INTERACTION_CV_FOLDS,
                **{key: {f"{r:g}": v[r] for r in per_row} for key, v in
                   (("scores", scores), ("z", z), ("certified", certified))}}

    def take_interaction_choice(self, choice: dict[str, Any]) -> None:
        """Set the interactions and lambda of a ``choose_interaction`` report (a checkpoint's)."""
        self._l2_grid = list(choice["l2"])
        self.energy.set_interaction_l2(float(choice["chosen"]))

    def held_out_one_tree(self, x: torch.Tensor, y: torch.Tensor, interaction_l2: float, lam: float,
                          fold: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Held-out predictions [N, n] of one-tree RTA models (the ensemble's first tree, this learner's feature map,
        margin and bias_reg) at ``interaction_l2`` and ``lam``, one per fold of ``fold`` [N] trained by BCFW (from
        ``dual_start``) on the other folds' rows of x [N, D], y [N, n], each predicting its own fold's rows; and
        whether every fold's model was certified at ``INTERACTION_CV_TOL`` within ``INTERACTION_CV_EPOCHS`` and the
        running time budget."""
        F, n = INTERACTION_CV_FOLDS, self.hparams.num_labels
        tree = Graph(n, self.trees.edges[:1].cpu())
        energy = TreeEnsembleEnergy(self.hparams.num_features, tree, normalize=self.energy.feature_map, num_models=F,
                                    interaction_l2=interaction_l2).to(x.device)
        energy.global_norm.copy_(self.energy.global_norm)
        masks = torch.stack([fold != f for f in range(F)])
        solver = BCFW(energy, len(x), torch.full((F,), lam), oracle=EnsembleOracle(1), bias_reg=self.bias_reg,
                      margin_scale=self.hparams.margin_scale, tol=INTERACTION_CV_TOL, mask=masks, margin=self.margin,
                      active_set=self.hparams.bcfw_active_set)
        rows = torch.arange(len(x), device=x.device).split(1024)
        full, order = [(x[i], y[i], i) for i in rows], torch.Generator().manual_seed(0)
        q = self.dual_start(x, y, torch.full((F,), lam / self.trees.num_graphs), masks)  # as the T trees at lam / T
        if q is not None:
            solver.start_at(full, q)
        for epoch in range(INTERACTION_CV_EPOCHS):
            for i in solver.start_pass(64, order, x.device):
                if out_of_time():
                    return self.predict_folds(energy, x, y, fold, rows), False
                solver.step(x[i], y[i], i)
            tick(epoch + 1, None, f"BCFW epochs at interaction_l2 {interaction_l2:g}",
                 lambda: f"gap estimate {float(solver.gap_estimate().max()):.2g}")
            if solver.should_certify():
                solver.duality_gap(full)
                if not bool(solver.active.any()):
                    return self.predict_folds(energy, x, y, fold, rows), True
        return self.predict_folds(energy, x, y, fold, rows), False

    @staticmethod
    def predict_folds(energy: TreeEnsembleEnergy, x: torch.Tensor, y: torch.Tensor, fold: torch.Tensor,
                      rows: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Each row's prediction [N, n] by the model (of ``energy``'s M, one per fold) of its own fold."""
        y_hat = torch.empty_like(y)
        with torch.no_grad():
            for i in rows:
                pot, own = energy(x[i]), (fold[i], torch.arange(len(i), device=i.device))  # row b: model fold[b]
                y_hat[i] = ensemble_map(Potentials(pot.unary[own], pot.pairwise[own], energy.graph), 1)[0]
        return y_hat

    @property
    def trees(self) -> Graph:
        """The ensemble of spanning trees (edges [T, n-1, 2])."""
        return self.energy.graph

    # ------------------------------------------------------------------ training
    @property
    def solver_name(self) -> str:
        return "bcfw" if self.hparams.solver == "auto" else self.hparams.solver

    def smoothed_max(self) -> None:
        return None  # no smoothed max of an ensemble: the certified solver is BCFW

    def dual_start(self, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor, mask: torch.Tensor | None
                   ) -> torch.Tensor | None:
        """With ``independent_start``: the product distributions of Independent's dual, label l of example i flipped
        with probability alpha_il / C (``independent_duals`` on varphi(x) at lambda n T / 4), q [N, M, n, 2];
        ``BCFW.start_at`` mixes them with the labels by its line search (a mix below ``BCFW.MIN_START_MIX``, as on
        delicious, is dropped: BCFW starts at w = 0).

        lambda n T / 4: a score spread over the trees' edges costs about n T / 2 times Independent's norm, and the
        edge marginals q_a (x) q_b add an interaction of about the same norm. Measured: D at the start against the
        multiplier (1/8, 1/4, 1/2, 1, 4 times n T / 2): emotions 1.70, 1.78, 1.88, 1.70, 0.86 (optimum 2.58);
        medical's shape 0.094, 0.147, 0.149, 0.104, 0.033."""
        T, n = self.trees.num_graphs, self.hparams.num_labels
        a = self.independent_solution(self.energy.features(x), y, lam * n * T / 4, mask, duals=True)
        if a is None:
            return None
        truth = torch.nn.functional.one_hot(y, 2).to(a.dtype).unsqueeze(1)  # [N, 1, n, 2]
        a = a.transpose(0, 1).unsqueeze(-1)  # [N, M, n, 1]
        return truth * (1 - a) + (1 - truth) * a

    def bcfw_oracle(self) -> Oracle:
        return self.oracle

    def bcfw_step_oracle(self) -> Oracle | None:
        """Above ``MANY_LABELS`` labels the steps search K-best lists of length k without doubling K: an
        uncertified search still gives a violator to step towards, and there Lemma 7 rarely certifies at any K up to
        32, so doubling cost the steps most of their time (delicious: every search went to K = 32, 18 rows/s against
        59 at K = 8). The certificate's pass and prediction double K (``bcfw_oracle``). At fewer labels the steps
        double K too (None): with fixed K, yeast at rta_table1's lambda = 1e-4 stalled until the certificate's
        late escalation (``BCFW``'s ``step_oracle``) and ended 60 epochs at a gap of 0.13 instead of a certified
        9e-4."""
        return self.step_oracle

    @property
    def certificate_rows(self) -> int:
        """Rows per batch of the certificate's pass: at most ``SEARCH_ELEMENTS`` of T trees x n labels x k_max per
        batch (delicious: 26 rows; 1024 rows there took the process past 23 GB and was killed), at most 1024."""
        return self._search_rows(self.hparams.k_max)

    @property
    def step_search_rows(self) -> int:
        """As ``certificate_rows`` for the steps' search, whose K is k (delicious: 106 rows)."""
        return self._search_rows(self.hparams.k)

    def _search_rows(self, k: int) -> int:
        T, n = self.trees.edges.shape[0], self.hparams.num_labels
        return max(1, min(1024, SEARCH_ELEMENTS // (T * n * k)))

    @property
    def exact(self) -> bool:
        """Whether the searches score every labelling: n <= model.exact_labels."""
        return self.hparams.num_labels <= self.hparams.exact_labels

    def search(self, pot: Potentials, exclude: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``ensemble_map`` with this model's k, k_max and (up to ``exact_labels`` labels) enumeration."""
        return ensemble_map(pot, self.hparams.k, self.hparams.k_max, exclude, self.exact)

    def worst_violator(self, pot: Potentials, y: torch.Tensor) -> torch.Tensor:
        return self.search(pot, exclude=y)[0]

    def _ensemble_max(self, pot: Potentials) -> torch.Tensor:
        """max_y F(y) [*B] (differentiable: the mean tree score of the maximiser)."""
        y = self.search(pot.detach())[0]
        return total_score(pot, y)

    # ------------------------------------------------------------------ prediction
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predict_with_certificate(x)[0]

    def predict_with_certificate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(y_hat [B, n], certified bool [B], K used [B], 0 where enumerated) by ``search``."""
        y, _, certified, k_used = self.search(self.potentials(x))
        return y, certified, k_used

    def _evaluate(self, batch: tuple[torch.Tensor, ...], metrics) -> torch.Tensor:
        x, y = batch[0], batch[1]
        y_hat, certified, k_used = self.predict_with_certificate(x)
        stage = metrics.prefix.rstrip("/")
        metrics.update(y_hat, y)
        self.certified[stage].update(certified.float())
        self.mean_k[stage].update(k_used.float())
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(x))
        self.log(f"{stage}/certified", self.certified[stage], on_step=False, on_epoch=True, batch_size=len(x))
        return y_hat

    def solver_report(self) -> dict[str, Any]:
        """The strategy's report (BCFW: with the K-best searches of its certificate under inference.train, of its
        steps under inference.steps), the margin it trained with and the mean K of the validation and test
        predictions."""
        report = super().solver_report() | {"margin": self.margin}
        report["inference"] = {"train": {}, **report.get("inference", {}),
                               **{s: {"mean_k": float(self.mean_k[s].compute()) if self.mean_k[s].update_count
                                      else None} for s in ("val", "test")}}
        return report

    # ------------------------------------------------------------------ structure
    #: with the training rows' ``label_cardinality`` (model.l2=auto's count) and the choices of the feature-map
    #: and interaction CVs
    set_up_reports = (*StructuredLearner.set_up_reports, "label_cardinality", "feature_choice", "interaction_choice")

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        choice = checkpoint.get("structtorch", {}).get("interaction_choice")
        if choice is not None:  # interaction_l2="auto": the interactions (and lambda) it trained with
            self.take_interaction_choice(choice)
        weights = checkpoint.get("state_dict", {})
        if "energy.feature_map_index" not in weights:  # written before the feature maps: x / |x| or x as given
            weights["energy.feature_map_index"] = self.energy.feature_map_index.new_tensor(
                FEATURE_MAPS.index("none" if self.hparams.normalize is False else "row"))
            weights["energy.global_norm"] = self.energy.global_norm.clone()
        saved = checkpoint.get("state_dict", {}).get("energy.tree_edges")
        if saved is not None and not torch.equal(saved.cpu(), self.trees.edges.cpu()):
            raise ValueError(f"the checkpoint's trees differ from the ones drawn from seed={self.hparams.seed} "
                             f"(num_trees={self.hparams.num_trees}): load it with the seed it was trained with")

    def structure_summary(self) -> dict[str, Any]:
        names, e = self.label_names, self.trees.edges
        return {"num_trees": self.trees.num_graphs, "is_forest": False, "feature_map": self.energy.feature_map,
                "feature_choice": self.feature_choice, "interaction_choice": self.interaction_choice,
                "trees": [[[names[a], names[b]] for a, b in tree.tolist()] for tree in e]}

    def structure_figure(self):
        T = self.trees.num_graphs
        return heatmap_figure(edge_frequency(self.trees), self.label_names,
                              f"RTA: edge frequency in {T} random spanning trees", "trees holding the edge")


#: MAM's default edge_l2: the edge tables' l2 weight relative to the node tables'. Chosen on 5-fold CV of the training
#: files (test files unused) as the smallest of 1, 2, 4, 16 at which MAM's held-out subset accuracy and example F1 are
#: at or above Independent's on flags, emotions and birds (differences to Independent, subset / F1): at 1, birds
#: -1.24 / -0.38 (the edge tables, D inputs each, overfit 322 rows); at 2, birds -0.94 / -0.12; at 4, birds +0.00 /
#: +0.25, flags +1.54 / +0.83, emotions +1.53 / +2.38 (at 1: flags +5.39 / +0.05, emotions +1.28 / +3.51); at 16 flags
#: +0.00 / +0.35. As edge_l2 grows the edge tables' x-dependent parts tend to 0
EDGE_L2 = 4.0


class MAM(StructuredLearner):
    """MAM (maximum average marginal aggregation, Su & Rousu 2013), RTA's comparison point: ``num_trees``
    random spanning-tree M3Ns trained *separately*, each label predicted by the mean over trees of its
    max-marginals (``tree_max_marginals``).

    The trees (drawn from ``seed`` as in ``RTA``) are one batched problem: a forest on T n nodes, node t n + i
    being tree t's copy of label i (``energy_labels`` copies the labels), so the certified solver trains every
    tree at once and each tree's hinge (Hamming margin) is its own; the objective is their sum. Each tree is an
    M3N with node and edge tables linear in x (``LinearTableEnergy``, input-dependent pairwise), the edge tables'
    l2 weighted by ``edge_l2`` against the node tables' (``EDGE_L2``).
    """

    #: model.l2=auto: lambda = 200 / N. A tree's node table [-s/2, s/2] of a score s costs half of s's l2, so at
    #: twice Independent's 100 / N each tree's node tables are regularised as Independent is and it starts at
    #: Independent's default model (``warm_start``), as FixedTree does. At 100 / N, on 70/30 validation splits of
    #: the training files, flags lost 1.3 / 1.0 / 2.2 points (Hamming / subset / example F1; 5 seeds) to 200 / N,
    #: birds 2.1 / 0.8 subset / F1 points (2 seeds), and emotions (3 seeds) moved by -0.6 / +1.3 in subset / F1
    auto_l2 = 200.0

    def __init__(self, num_features: int, num_labels: int, num_trees: int = 10, seed: int = 0,
                 independent_start: bool = True, edge_l2: float = EDGE_L2, **kwargs) -> None:
        check_int(num_trees, "MAM: num_trees", 1)
        check_bool(independent_start, "MAM: independent_start")
        self.edge_l2 = check_float(edge_l2, "MAM: edge_l2", 0.0, finite=True)  # read by build_energy, in __init__
        self.trees = random_spanning_trees(num_labels, num_trees, torch.Generator().manual_seed(seed))
        super().__init__(num_features, num_labels, **kwargs)
        self.save_hyperparameters({"independent_start": independent_start, "edge_l2": self.edge_l2})
        self._predict = self._average_max_marginals

    def warm_start(self, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor, mask: torch.Tensor | None
                   ) -> torch.Tensor | None:
        """With ``independent_start``: every tree at Independent's solution, its edge tables at 0. A tree's node
        table [-s/2, s/2] of a score s costs half of s's l2, so each tree's model is Independent's at lambda / 2."""
        start = self.independent_solution(x, y, lam / 2, mask)
        if start is None:
            return None
        T, energy = self.trees.num_graphs, self.energy
        w, b, objective = start  # [M, n, D], [M, n], [M]
        w = torch.stack([-w, w], 2).div(2).repeat(1, T, 1, 1).flatten(1, 2)  # [M, T n K, D]
        b = torch.stack([-b, b], 2).div(2).repeat(1, T, 1).flatten(1, 2)  # [M, T n K]
        if self.num_models is None:
            w, b = w[0], b[0]
        with torch.no_grad():  # rows t n K + i K + a: tree t's copy of label i, state a
            energy.unary.weight.copy_(w)
            energy.unary.bias.copy_(b)
            energy.pairwise.weight.zero_()
            energy.pairwise.bias.zero_()
        return T * objective  # the trees' objectives add up

    def build_energy(self) -> LinearTableEnergy:
        T, n = self.trees.num_graphs, self.trees.num_nodes
        forest = Graph(T * n, (self.trees.edges + n * torch.arange(T)[:, None, None]).reshape(-1, 2))
        return LinearTableEnergy(self.hparams.num_features, T * n, 2, forest, input_dependent_pairwise=True,
                                 num_models=self.num_models, pairwise_l2=self.edge_l2)

    def energy_labels(self, y: torch.Tensor) -> torch.Tensor:
        return y.repeat(1, self.trees.num_graphs)  # [B, T n]: every tree's copy of the labels

    def tree_potentials(self, pot: Potentials) -> Potentials:
        """The forest's potentials [*B, T n, K], [*B, T (n-1), K, K] as the ensemble of the T trees."""
        T, n = self.trees.num_graphs, self.trees.num_nodes
        return Potentials(pot.unary.unflatten(-2, (T, n)), pot.pairwise.unflatten(-3, (T, n - 1)), self.trees)

    def _average_max_marginals(self, pot: Potentials) -> torch.Tensor:
        """argmax_a of the mean over trees of the max-marginals of label i, a: [*B, n]."""
        return tree_max_marginals(self.tree_potentials(pot)).mean(-3).argmax(-1)

    def structure_summary(self) -> dict[str, Any]:
        names = self.label_names
        return {"num_trees": self.trees.num_graphs, "is_forest": False,
                "trees": [[[names[a], names[b]] for a, b in tree.tolist()] for tree in self.trees.edges]}

    def structure_figure(self):
        return heatmap_figure(edge_frequency(self.trees), self.label_names,
                              f"MAM: edge frequency in {self.trees.num_graphs} random spanning trees",
                              "trees holding the edge")


def edge_frequency(trees: Graph) -> torch.Tensor:
    """How many trees of an ensemble hold each label pair: [n, n] (symmetric)."""
    n, e = trees.num_nodes, trees.edges.reshape(-1, 2)
    freq = torch.zeros(n, n)
    freq.index_put_((e[:, 0], e[:, 1]), torch.ones(len(e)), accumulate=True)
    return freq + freq.T
