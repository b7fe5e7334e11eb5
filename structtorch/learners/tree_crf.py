"""TreeCRF: tree conditional random fields with learned structure (Bradley & Guestrin, ICML 2010).

Algorithm 1: weight every label pair by an edge score from estimated conditionals (``edge_scores``:
piecewise, local CMI, DCI, global CMI, or the generative Chow-Liu score), keep the max spanning tree,
then fit a tree CRF whose factors are log-linear in the labels' local inputs (``LocalLinearEnergy``)
by l2-regularised conditional log-likelihood, exact through ``tree_logz`` (solver="lbfgs": L-BFGS
with a duality-gap certificate; a list of l2 values is chosen by cross-validation). It predicts by the decoder
(joint mode, each label's posterior mode, or plug-in expected F1) that scores best on held-out rows of that
cross-validation (``test_inference="auto"``).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from ..energies import LocalLinearEnergy
from ..estimation import EDGE_SCORES, edge_scores, select_inputs
from ..folds import rows_at_most
from ..graph import Graph, check_int
from ..metrics import SELECTION_METRICS, example_scores
from ..progress import budget_share, phase
from ..strategies.certified import lbfgs_solver
from ..structure import candidate_graph, max_spanning_tree
from .base import TEST_INFERENCE, StructuredLearner, training_set

__all__ = ["TreeCRF"]

INPUT_MAPPINGS = ("l1", "aligned")
#: test_inference="auto" chooses among these, the first unless another is as good on held-out rows (``choose_decoder``).
#: On the matrix's test files (``experiments/results/tree_crf_decoders.md``) no one decoder stayed within a point of
#: Independent on both subset accuracy and example F1: tree_mpm was 1.9 F1 points below it on birds (0.64 labels
#: predicted per row, 0.97 true), tree_map 1.6-2.7 F1 points below on flags, yeast, birds and delicious, tree_f1 3.3
#: and 6.2 subset points below on tmc2007 and flags
DECODERS = ("tree_mpm", "tree_map", "tree_f1")


class TreeCRF(StructuredLearner):
    """Tree CRF over the labels with its tree chosen by max spanning tree of edge scores.

    Args:
        score: the edge score, one of ``EDGE_SCORES`` ("dci" is the paper's choice).
        inputs: the input mapping X_i of label i: "l1" (the ``num_inputs`` columns with the largest
            weights of an l1 logistic regression of y_i) or "aligned" (column i, for data with one input
            per label such as ``data=tree_crf_synthetic``; needs num_features == num_labels).
        num_inputs: k, the size of each X_i under "l1".
        local_unary: unary factors on X_i only (True) or on all inputs (False, default: real data, where
            a label's evidence is spread over many features).
        num_states: K, the label states.
        score_folds: folds of the cross-validation that picks each conditional's l2 penalty.
        candidates: m: the edge scores are computed for each label's m most dependent partners by mutual information
            (``structure.candidate_graph``, at most n m pairs, chosen when fitting starts; the tree is then a max
            spanning tree, or forest, of that graph); the complete graph while n <= 2 m + 1, or with None.
        score_rows: the input mapping and the edge scores (each a batch of cross-validated regressions) are
            estimated on at most this many training rows, a seeded subset (None: all rows); the CRF itself is
            trained on every row. Structure learning's time then stops growing with N (tmc2007: 21,519 rows).
        test_inference: how the CRF predicts (``inference.decode``): "tree_mpm" (each label's posterior mode, the
            Bayes decision for the Hamming loss that the M3N learners train for), "tree_map" (the joint mode: subset
            0/1), "tree_f1" (plug-in expected F1; binary labels), or "auto" (default): by the predictions of the
            held-out rows of model.l2=auto's CV at the chosen lambda, "tree_mpm" unless another of ``DECODERS`` is at
            least as good on both subset accuracy and example F1 and better on their sum beyond the CV's noise
            (``choose_decoder``; logged, and in metrics.json under ``structure.decoder_choice``); "tree_mpm" where
            model.l2 is given (a number or a grid).
            ``experiments/results/tree_crf_decoders.md``.
        cv_folds: folds of the CV that chooses model.l2=auto (``choose_l2``), and of a grid's (``model.l2=[...]``).
        Other args as ``StructuredLearner`` (loss defaults to "crf", solver "auto" = certified L-BFGS).
    """

    #: model.l2=auto: lambda = 200 / N, at most 0.3; 5-fold CV chose lambda = 0.3 on scene, emotions and yeast
    #: (N = 969, 313, 1200 per fold: 290 / N, 94 / N, 360 / N; ``experiments/results/baselines_mulan.md``). The cap
    #: keeps small training sets from a prior that outweighs their data: on 70/30 validation splits of the training
    #: files (3 seeds) 0.3 beat 200 / N on flags (N = 90: subset 21.4 vs 16.2 %) and matched it on emotions
    auto_l2 = 200.0
    max_auto_l2 = 0.3
    #: model.l2=auto: the path of multiples of auto_l2 / N (capped) that cv_folds-fold CV walks down (``choose_l2``).
    #: At medical's shape (45 labels, 1,449 sparse binary features, 333 rows) the held-out Hamming accuracy rose at
    #: every step down from the cap's 0.3 to 0.0012 (subset accuracy 46.82 % at 0.3, 61.09 at 0.033, 65.89 at 0.0012);
    #: on scene, emotions, yeast and birds CV chose 0.3 in a grid from 0.01 to 1
    auto_l2_steps = (1.0, 1 / 3, 0.1, 1 / 30, 0.01)
    #: the share of the time left that the CV of model.l2=auto may take (the path stops there), and the relative
    #: duality gap its fold models are certified to (model.tol = 1e-3 is for the model that predicts). At medical's
    #: shape 0.05 gave the held-out scores of 0.01 to within 0.01 points at every lambda and the same choice, in 64 s
    #: of CV instead of 83-87 s. The fit starts at the chosen fold models, so it needs little of the rest: at bibtex's
    #: shape a share of 0.5 ended the path at 0.0046 uncertified (0.015 chosen; 83.74 / 87.88 subset / example F1,
    #: Independent 85.13 / 89.14), 0.75 walked it to 0.00046 in 265 s and the fit certified in 100 s: 85.21 / 89.26
    cv_share, cv_tol = 0.75, 0.05
    #: test_inference="auto" after a CV on a subset of the rows: the share of the CV's time left that refitting the
    #: fold models at lambda may take (``choose_l2``); uncertified there, the decoder is tree_mpm. On tmc2007 the
    #: whole CV, the refit included, took 16 s; at bibtex's shape the path had spent the CV's share and it got none
    decoder_share = 0.25

    def __init__(self, num_features: int, num_labels: int, score: str = "dci", inputs: str = "l1",
                 num_inputs: int = 10, local_unary: bool = False, num_states: int = 2, score_folds: int = 5,
                 candidates: int | None = 10, score_rows: int | None = 2000, loss: str = "crf",
                 test_inference: str = "auto", cv_folds: int = 3, **kwargs: Any) -> None:
        if score not in EDGE_SCORES:
            raise ValueError(f"model.score must be one of {EDGE_SCORES}, got {score!r}")
        if inputs not in INPUT_MAPPINGS:
            raise ValueError(f"model.inputs must be one of {INPUT_MAPPINGS}, got {inputs!r}")
        if inputs == "aligned" and num_features != num_labels:
            raise ValueError(f"model.inputs=aligned gives label i input column i and needs as many input columns "
                             f"as labels, got {num_features} columns for {num_labels} labels: use inputs=l1")
        check_int(num_inputs, "model.num_inputs", 1)
        check_int(score_folds, "model.score_folds", 2)
        if candidates is not None:
            check_int(candidates, "model.candidates", 1, expected="None or an int >= 1")
        if score_rows is not None:
            check_int(score_rows, "model.score_rows", 2, expected="None or an int >= 2")
        self.candidates = candidates  # read by build_energy
        self._num_inputs = 1 if inputs == "aligned" else min(num_inputs, num_features)
        self._local_unary, self._num_states = local_unary, num_states  # build_energy runs inside super().__init__
        decoder = DECODERS[0] if test_inference == "auto" else test_inference  # until ``choose_l2`` chooses
        super().__init__(num_features, num_labels, loss=loss, test_inference=decoder, cv_folds=cv_folds, **kwargs)
        self.save_hyperparameters({"score": score, "inputs": inputs, "num_inputs": num_inputs,
                                   "local_unary": local_unary, "num_states": num_states, "score_folds": score_folds,
                                   "candidates": candidates, "score_rows": score_rows,
                                   "test_inference": test_inference})
        self.decoder_choice: dict[str, Any] | None = None  # test_inference="auto": ``choose_l2``'s
        self.register_buffer("edge_score", torch.zeros(self.graph.num_edges, dtype=torch.float64))  # on the graph
        self.register_buffer("chosen_l2", torch.tensor(float("nan"), dtype=torch.float64))  # model.l2=auto's CV
        self._cv_start: list[torch.Tensor] | None = None  # the fit's start from that CV (``warm_start``)

    def build_energy(self) -> LocalLinearEnergy:
        return self.local_energy(self.search_graph(self.candidates), self.num_models)

    def local_energy(self, graph: Graph, num_models: int | None) -> LocalLinearEnergy:
        """A fresh ``LocalLinearEnergy`` (weights 0) of this learner's sizes on ``graph``."""
        hp = self.hparams
        return LocalLinearEnergy(hp.num_features, hp.num_labels, self._num_inputs, self._num_states, graph,
                                 local_unary=self._local_unary, num_models=num_models)

    def build_candidates(self, x: torch.Tensor, y: torch.Tensor) -> Graph:
        """Each label's ``candidates`` most dependent partners (``candidate_graph``): the pairs that get scores."""
        return candidate_graph(y, self.candidates, self._num_states)

    def set_candidates(self, graph: Graph) -> None:
        super().set_candidates(graph)
        self.edge_score = torch.zeros(graph.num_edges, dtype=torch.float64, device=self.edge_score.device)

    def input_mapping(self, x: torch.Tensor, y: torch.Tensor) -> list[list[int]]:
        """X_i for every label, from the training set x [N, D], y [N, n]."""
        if self.hparams.inputs == "aligned":
            return [[i] for i in range(self.hparams.num_labels)]
        return select_inputs(x, y, self._num_inputs)

    def build_structure(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Input mapping, edge scores on the candidate graph, and their max spanning tree (bool [E]), from at most
        ``score_rows`` of the training rows, on the device the learner trains on (``fit_device``)."""
        hp, graph = self.hparams, self.graph
        x, y, rows = rows_at_most(x, y, hp.score_rows, "model.score_rows")
        x, y = x.to(self.fit_device), y.to(self.fit_device)  # 19-26x faster on an H100 than on its 16 CPU cores
        with phase(f"inputs of each label ({hp.inputs}){rows}", quiet=hp.inputs == "aligned"):
            inputs = self.input_mapping(x, y)
        self.energy.set_inputs(inputs)
        with phase(f"edge scores ({hp.score}) of {graph.num_edges} label pairs{rows}"):
            scores = edge_scores(x, y, hp.score, inputs=inputs, num_states=hp.num_states, cv_folds=hp.score_folds,
                                 graph=graph)
        self.edge_score = scores.to(self.edge_score)
        return (max_spanning_tree(scores, graph) & scores.isfinite()).cpu()  # pairs left unscored (-inf): no edge

    def structure_weights(self) -> torch.Tensor | None:
        """The edge score of each kept edge [E] (what the max spanning tree maximised)."""
        if not self.structure_mask.numel():
            return None
        return self.edge_score[self.structure_mask.to(self.edge_score.device)].float().cpu()

    def structure_summary(self) -> dict[str, Any]:
        return {**super().structure_summary(), "decoder_choice": self.decoder_choice}

    #: with test_inference="auto"'s choice
    set_up_reports = (*StructuredLearner.set_up_reports, "decoder_choice")

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if self.decoder_choice is not None:
            self._predict = TEST_INFERENCE[self.decoder_choice["chosen"]]

    def setup(self, stage: str) -> None:
        """As ``StructuredLearner.setup``; then model.l2=auto is chosen by cross-validation (``choose_l2``)."""
        super().setup(stage)
        if stage == "fit" and self.hparams.l2 == "auto":
            self.choose_l2(*training_set(self.trainer))
        elif stage == "fit" and self.hparams.test_inference == "auto" and self.decoder_choice is None:
            rank_zero_info(f"TreeCRF: test_inference=auto: no CV of model.l2 to choose by; {DECODERS[0]}")

    def choose_l2(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """model.l2=auto: lambda by ``cv_folds``-fold CV of the CRF on the learned tree (held-out ``cv_metric``) on at
        most ``score_rows`` rows of x [N, D], y [N, n], down the path auto_l2 / N (``resolve_l2``) times
        ``auto_l2_steps``: each lambda's fold models start at the previous one's solution, and the path stops at the
        first lambda whose held-out scores are not better than the last chosen one's by more than the standard error
        of their paired difference (one training set's CV is noisy: flags has 116 rows), or that is not certified (to
        ``cv_tol``) within ``cv_share`` of the time left. A fold trains at lambda * N / rows (the same weight against
        each example's loss as on all N rows). The fit then starts at the mean of the chosen lambda's fold models
        (``warm_start``). With test_inference="auto" the chosen lambda's fold models also choose the decoder
        (``choose_decoder``). A checkpoint keeps the choices. Sets ``l2_grid`` and ``cv_report``; returns lambda."""
        if self.chosen_l2.isfinite():
            self._l2_grid = [float(self.chosen_l2)]
            return self._l2_grid[0]
        hp, auto = self.hparams, self.resolve_l2(len(x))[0]
        k, tried, scores, best, chosen, start, decoders = hp.cv_folds, [], [], None, auto, None, None
        xs, ys, rows = rows_at_most(x, y, hp.score_rows, "model.score_rows")
        fold = self.cv_folds_of(len(xs)).to(self.fit_device)
        mask = torch.stack([fold != f for f in range(k)])  # [k, rows]: fold f's model trains without fold f
        energy = self.grid_energy(k).to(self.fit_device)
        x_fit = energy.stored_inputs(xs.to(self.fit_device, torch.float64))  # once for the path's solvers
        labels = self.energy_labels(ys.to(self.fit_device))
        name = f"{type(self).__name__} l2 (model.l2=auto): {k}-fold CV down from {auto:.4g}{rows}"
        with phase(name), budget_share(self.cv_share):
            for lam in (auto * step for step in self.auto_l2_steps):
                fit = torch.full((k,), lam * len(x) / len(xs), dtype=torch.float64, device=self.fit_device)
                solver = lbfgs_solver(self, energy, x_fit, labels, fit, mask, tol=max(hp.tol, self.cv_tol))
                if not bool(solver.fit().converged.all()):
                    break  # out of the CV's time: the lambdas certified so far
                held = self.cv_scores(energy, xs, ys, 1, k)[0]  # [rows]
                tried.append(lam)
                scores.append(float(held.mean()))
                if best is not None and not _better(held, best):
                    break
                best, chosen, start = held, lam, [p.detach().mean(0) for p in energy.parameters()]
                if hp.test_inference == "auto" and len(xs) == len(x):
                    decoders = self.decoder_scores(energy, xs, ys)
            if hp.test_inference == "auto" and best is not None and decoders is None:
                # on a subset of rows the path's fold models weigh the prior N / rows times more against each row's loss
                # than the fit on all N rows does: flatter posteriors, which favour tree_f1 (README, TreeCRF)
                fit = torch.full((k,), chosen, dtype=torch.float64, device=self.fit_device)
                with budget_share(self.decoder_share):
                    refit = lbfgs_solver(self, energy, x_fit, labels, fit, mask, tol=max(hp.tol, self.cv_tol)).fit()
                if bool(refit.converged.all()):
                    decoders = self.decoder_scores(energy, xs, ys)
        # not certified even at auto_l2 / N: its fold models as they are
        self._cv_start = start if best is not None else [p.detach().mean(0) for p in energy.parameters()]
        self.cv_report = {"metric": hp.cv_metric, "folds": k, "rows": len(xs), "l2": tried, "scores": scores,
                          "chosen_l2": chosen}
        rank_zero_info(f"{type(self).__name__}: model.l2=auto: lambda = {chosen:.4g}, by {k}-fold CV "
                       f"({hp.cv_metric}) on {len(xs)} rows" if best is not None else
                       f"{type(self).__name__}: model.l2=auto: its CV was not certified within its share of the time "
                       f"budget; lambda = {auto:.4g}")
        self._l2_grid = [chosen]
        self.chosen_l2.fill_(chosen)
        if hp.test_inference == "auto":
            self.choose_decoder(decoders, chosen)
        return chosen

    def decoder_scores(self, energy: LocalLinearEnergy, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each decoder of ``DECODERS`` (binary labels: all; else the first two): the held-out ``SELECTION_METRICS``
        [N, 2] (subset accuracy, example F1) of its predictions of x [N, D] against y [N, n], each row by the batched
        ``energy``'s fold model that did not train on it (``cv_folds_of``)."""
        names = DECODERS if self._num_states == 2 else DECODERS[:2]
        fold, rows = self.cv_folds_of(len(x)), torch.arange(len(x))
        y_hat = self.all_predictions(energy, x, tuple(TEST_INFERENCE[name] for name in names))  # [k, N, n] each
        return {name: torch.stack([example_scores(m, p[fold, rows], y) for m in SELECTION_METRICS], -1)
                for name, p in zip(names, y_hat)}

    def choose_decoder(self, per_row: dict[str, torch.Tensor] | None, lam: float) -> str:
        """test_inference="auto": the first of ``DECODERS`` (each label's posterior mode) unless another decoder's
        held-out rows (``decoder_scores`` at the chosen lambda ``lam``, [N, 2] each) have a mean subset accuracy and
        a mean example F1 both at least its, and a sum of the two above its by more than the standard error of the
        paired difference (``_better``, as lambda's path); then the one of those with the largest sum. Sets
        ``decoder_choice`` and returns its name. None (no certified fold models): the first."""
        first = DECODERS[0]
        if per_row is None:
            self.decoder_choice = {"chosen": first, "scores": None, "l2": lam}
            rank_zero_info(f"TreeCRF: test_inference=auto: no certified fold models to choose by; {first}")
            return first
        means = {name: v.mean(0) for name, v in per_row.items()}  # [2]
        better = [name for name, v in per_row.items() if bool((means[name] >= means[first]).all())
                  and _better(v.sum(-1), per_row[first].sum(-1))]
        chosen = max(better, key=lambda name: float(means[name].sum())) if better else first
        self._predict = TEST_INFERENCE[chosen]
        scores = {name: dict(zip(SELECTION_METRICS, m.tolist())) for name, m in means.items()}
        self.decoder_choice = {"chosen": chosen, "scores": scores, "l2": lam}
        listed = ", ".join(f"{name} {m[0]:.4f} / {m[1]:.4f}" for name, m in means.items())
        rank_zero_info(f"TreeCRF: test_inference=auto chose {chosen} (held-out subset accuracy / example F1: {listed})")
        return chosen

    def warm_start(self, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor, mask: torch.Tensor | None
                   ) -> None:
        """After the CV of model.l2=auto: the energy starts at the mean of the chosen lambda's fold models (of the
        first lambda's, as far as they got, where the CV's time ran out), so the CV's time also serves the fit.
        Returns None: the CRF's objective has no temperature to set."""
        start, self._cv_start = self._cv_start, None
        if start is not None and self.num_models is None:
            with torch.no_grad():
                for p, value in zip(self.energy.parameters(), start):
                    p.copy_(value)

    def grid_energy(self, num_models: int) -> LocalLinearEnergy:
        """A fresh energy of ``num_models`` batched models (weights 0) with this one's graph and input mapping."""
        built = self.energy
        energy = self.local_energy(built.graph, num_models).to(torch.float64)
        energy.unary_inputs.copy_(built.unary_inputs)
        energy.pair_inputs.copy_(built.pair_inputs)
        return energy


def _better(held: torch.Tensor, best: torch.Tensor) -> bool:
    """Whether held-out scores [N] beat ``best`` [N] (the same examples) by more than the standard error of the mean
    paired difference."""
    d = held - best
    return bool(d.mean() > d.std() / len(d) ** 0.5)
