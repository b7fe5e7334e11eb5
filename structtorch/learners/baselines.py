"""Baseline learners: Independent (Empty), FixedTree (M3N on a given tree, e.g. Chow-Liu), Full
(complete graph, LP relaxation), and CRANK's structure-search baselines Greedy and MST (Sec. 6)."""

from __future__ import annotations

import logging

import torch

from ..energies import FinleyJoachimsEnergy
from ..graph import Graph, check_int
from ..inference import lp_map, smoothed_lp, tree_map
from ..losses import hamming_margin
from ..potentials import Potentials
from ..progress import out_of_time
from ..solvers import ForestSmoothedMax, LPSmoothedMax, Oracle, SmoothedLBFGS, SmoothedMax, smoothed_oracle
from ..state import ExampleState
from ..structure import circuit_rank, max_spanning_tree
from ..structure.edge_scores import candidate_graph, chow_liu_tree
from .base import StructuredLearner

log = logging.getLogger(__name__)

__all__ = ["M3N", "Independent", "FixedTree", "Full", "Greedy", "MST", "edge_mask", "forest_objectives",
           "train_forests"]


class M3N(StructuredLearner):
    """A learner of the Finley-Joachims energy (``FinleyJoachimsEnergy``) on a graph of its choice.

    Args:
        spin: pairwise scores w_ij s_i s_j on spins s = 2y - 1 (Ising couplings, the default); False: the
            paper's w_ij y_i y_j. The same score functions once the biases are included, but l2 prices a
            coupling 16 times less with spins (``FinleyJoachimsEnergy``).
        candidates: m, the label pairs a structure search (Full, CRANK, Project, Greedy, MST) chooses among: each
            label's m most dependent partners by mutual information on the training labels
            (``structure.candidate_graph``, at most n m pairs), chosen when fitting starts; the complete graph
            while n <= 2 m + 1 (every label set of the papers at the default 10) or with None.
        Other args as ``StructuredLearner``.
    """

    #: True for learners that choose their edges among candidates (Full, CRANK, Project, Greedy, MST)
    searches_structure = False

    def __init__(self, num_features: int, num_labels: int, spin: bool = True, candidates: int | None = 10,
                 **kwargs) -> None:
        if candidates is not None:
            check_int(candidates, "model.candidates", 1, expected="None or an int >= 1")
        self.spin, self.candidates = spin, candidates  # read by build_energy, called in StructuredLearner.__init__
        super().__init__(num_features, num_labels, **kwargs)
        self.save_hyperparameters({"spin": spin, "candidates": candidates})

    def m3n_energy(self, graph: Graph, num_models: int | None) -> FinleyJoachimsEnergy:
        """The Finley-Joachims energy of these features and labels on ``graph``."""
        return FinleyJoachimsEnergy(self.hparams.num_features, self.hparams.num_labels, graph, num_models=num_models,
                                    spin=self.spin)

    def label_graph(self) -> Graph:
        """The graph a structure search chooses from: the candidate graph once chosen from the training labels;
        before that the complete graph while it is the candidate graph anyway (n <= 2 m + 1), else no edges."""
        n, chosen = self.hparams.num_labels, self.candidate_graph()
        if chosen is not None:
            return chosen
        return Graph.complete(n) if self.candidates is None or n <= 2 * self.candidates + 1 else Graph.empty(n)

    def build_candidates(self, x: torch.Tensor, y: torch.Tensor) -> Graph | None:
        """Each label's ``candidates`` most dependent partners (``candidate_graph``) for a structure search."""
        return candidate_graph(y, self.candidates) if self.searches_structure else None


class Independent(M3N):
    """Empty structure: one linear max-margin classifier per label (CRANK's Empty baseline)."""

    def build_energy(self) -> FinleyJoachimsEnergy:
        return self.m3n_energy(Graph.empty(self.hparams.num_labels), self.num_models)


class FixedTree(M3N):
    """M3N (Finley-Joachims energy) on a tree or forest over the labels.

    Args:
        tree: how the tree is chosen from the training data when ``edges`` is None: "chow_liu" (max
            spanning tree of the labels' mutual information), "chain", "star" or "empty". The energy
            is built on the complete graph and restricted to the tree before training
            (``build_structure``); the tree is kept in the checkpoint.
        edges: an explicit tree as label pairs [[i, j], ...] (then ``tree`` is ignored).
        Other args as ``M3N``.
    """

    TREES = ("chow_liu", "chain", "star", "empty")

    def __init__(self, num_features: int, num_labels: int, tree: str = "chow_liu",
                 edges: list[list[int]] | None = None, **kwargs) -> None:
        if edges is None and tree not in self.TREES:
            raise ValueError(f"model.tree must be one of {self.TREES}, got {tree!r}")
        self._edges = None if edges is None else torch.as_tensor(edges, dtype=torch.long).reshape(-1, 2)
        super().__init__(num_features, num_labels, **kwargs)
        self.save_hyperparameters({"tree": tree, "edges": None if edges is None else self._edges.tolist()})

    def build_energy(self) -> FinleyJoachimsEnergy:
        n = self.hparams.num_labels
        graph = Graph.complete(n) if self._edges is None else Graph(n, self._edges)
        if not graph.is_forest and self._edges is not None:
            raise ValueError(f"FixedTree needs a tree or forest over the labels, got edges {self._edges.tolist()}")
        return self.m3n_energy(graph, self.num_models)

    def build_structure(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        if self._edges is not None:
            return None
        n = self.hparams.num_labels
        trees = {"chow_liu": lambda: chow_liu_tree(y), "chain": lambda: Graph.chain(n),
                 "star": lambda: Graph.star(n), "empty": lambda: Graph.empty(n)}
        return edge_mask(trees[self.hparams.tree](), self.energy.graph)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._edges is None and not self.structure_mask.numel():
            raise RuntimeError(f"FixedTree(tree={self.hparams.tree!r}) chooses its tree from the training data "
                               f"when fitted: call Trainer.fit first, or pass edges=[[i, j], ...]")
        return super().forward(x)


def edge_mask(sub: Graph, candidate: Graph) -> torch.Tensor:
    """bool [E] over ``candidate``'s edges: True where the (undirected) edge is in ``sub``."""
    def key(e: torch.Tensor) -> torch.Tensor:
        return e.amin(1) * candidate.num_nodes + e.amax(1)
    return torch.isin(key(candidate.edges), key(sub.edges.reshape(-1, 2)))


def train_forests(x: torch.Tensor, y: torch.Tensor, forests: torch.Tensor, lam: float, bias_reg: float = 1e-4,
                  tol: float = 1e-3, margin_scale: float = 1.0, start: tuple[SmoothedLBFGS, int] | None = None,
                  iterations: int | None = None, spin: bool = False, graph: Graph | None = None) -> SmoothedLBFGS:
    """M3N on each of M forests, all trained as one batched model to a relative duality gap <= tol.

    x [N, D], y [N, n] long; forests: bool [M, E] over ``graph``'s edges (default ``Graph.complete(n)``), each
    row a forest.
    start: (solver, m) of an earlier call: every model starts from its model m (weights, zero on the edges
    outside m's forest, and temperature), e.g. a forest grown by one edge starts from the forest's
    optimum. iterations: instead of certifying at tol, that many L-BFGS iterations at the starting
    temperature, then one certificate. spin: as ``FinleyJoachimsEnergy``. Returns the solver (``.last``: the
    certificate [M], ``.energy``: the weights; exact tree inference per model: ``ForestSmoothedMax``)."""
    n = y.shape[1]
    graph = Graph.complete(n) if graph is None else graph
    energy = FinleyJoachimsEnergy(x.shape[1], n, graph, num_models=forests.shape[0], spin=spin).to(torch.float64)
    energy.edge_mask.copy_(forests)
    if start is not None:
        old, m = start
        with torch.no_grad():
            for p, q in zip(energy.parameters(), old.energy.parameters()):
                p.copy_(q[m].expand_as(p))
            energy.edge_weight.mul_(old.energy.edge_mask[m])
    smax = ForestSmoothedMax(forests, graph)
    solver = SmoothedLBFGS(energy, x, y, lam, smoothed_max=smax, exact_max=smax.exact, margin_scale=margin_scale,
                           bias_reg=bias_reg, tol=tol)
    if start is not None:
        solver.eps = start[0].eps[start[1]].expand_as(solver.eps).clone()
    if iterations is None:
        solver.fit()
    else:
        solver.run(iterations)
        solver.certify()
    return solver


def forest_objectives(x: torch.Tensor, y: torch.Tensor, forests: torch.Tensor, lam: float, bias_reg: float = 1e-4,
                      tol: float = 1e-3, margin_scale: float = 1.0, spin: bool = False) -> torch.Tensor:
    """The certified optimum of the M3N objective on each of M forests (``train_forests`` from w = 0): the
    primal objective [M] (float64) at a relative duality gap <= tol. spin: as ``FinleyJoachimsEnergy``."""
    return train_forests(x, y, forests, lam, bias_reg, tol, margin_scale, spin=spin).last.primal


class _StructureSearch(FixedTree):
    """A FixedTree whose tree is found by training forests of the candidate graph (CRANK's Sec. 6 baselines)."""

    searches_structure = True

    def __init__(self, num_features: int, num_labels: int, **kwargs) -> None:
        super().__init__(num_features, num_labels, **kwargs)
        if self.num_models is not None:
            raise ValueError(f"{type(self).__name__}: model.l2 must be one number (the search trains candidate "
                             f"forests as the batched models)")
        self.search_log: list[dict] = []

    def build_energy(self) -> FinleyJoachimsEnergy:
        return self.m3n_energy(self.label_graph(), self.num_models)

    def _train(self, x: torch.Tensor, y: torch.Tensor, forests: torch.Tensor,
               start: tuple[SmoothedLBFGS, int] | None = None, iterations: int | None = None,
               graph: Graph | None = None) -> SmoothedLBFGS:
        """``train_forests`` with this learner's settings; forests over ``graph`` (default: the energy's)."""
        hp = self.hparams
        return train_forests(x.to(torch.float64), y, forests, self.l2_grid[0], self.bias_reg, hp.tol, hp.margin_scale,
                             start, iterations, self.spin, self.energy.graph if graph is None else graph)

    def structure_summary(self) -> dict:
        """The learned tree and the search that found it (objectives per step / per edge)."""
        return {**super().structure_summary(), "search": self.search_log}


class MST(_StructureSearch):
    """CRANK's MST baseline: the objective gain of each candidate edge alone over the empty model, the maximum
    spanning tree of those gains, then M3N on that tree.

    The M3N objective of a forest is the sum of its connected components' objectives (the l2 term and the
    Hamming-margin hinge both split over them), so the gain of edge (i, j) is obj_i + obj_j - obj_ij: the empty
    model's objectives of labels i and j alone less the objective of the two-label model on (i, j). Every label
    alone and every candidate edge's pair are the components of one forest of n + 2E label copies (copy c predicts
    label ``copies[c]``), trained as one model to its certificate; then each component's objective is evaluated
    with its exact loss-augmented max (``tree_map`` per pair). n + 2E labels in all, not E models of n labels.
    """

    def build_structure(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        graph = self.energy.graph
        n, E = graph.num_nodes, graph.num_edges
        copies = torch.cat([torch.arange(n), graph.edges.reshape(-1)])  # [n + 2E]: the label of each copy
        union = Graph(n + 2 * E, n + torch.arange(2 * E).view(E, 2))  # copy edges of the E pairs
        y = y[:, copies]
        solver = self._train(x, y, torch.ones(1, E, dtype=torch.bool), graph=union)
        objective = self._component_objectives(solver, y, n, E)  # [n + E]
        gains = objective[graph.edges].sum(1) - objective[n:]
        self.search_log = [{"empty": float(objective[:n].sum()), "gains": gains.tolist(),
                            "certificate": float(solver.last.relative_gap[0])}]
        return max_spanning_tree(gains, graph).cpu()

    def _component_objectives(self, solver: SmoothedLBFGS, y: torch.Tensor, n: int, E: int) -> torch.Tensor:
        """The M3N objective [n + E] (float64) of each component of the copies' forest at the solver's weights:
        labels alone, then the E pairs; l2 on its weights (bias_reg on biases) plus its mean hinge, each with the
        exact loss-augmented max."""
        energy, lam, rho = solver.energy, self.l2_grid[0], self.bias_reg
        with torch.no_grad():
            pot = energy(solver.x)
            unary, pair = pot.unary[0], pot.pairwise[0, 0]  # [N, L, 2], [E, 2, 2]
            augmented = unary + hamming_margin(y, 2, self.hparams.margin_scale, unary.dtype)
            truth = unary.gather(-1, y[..., None])[..., 0]  # [N, L]: the labels' unary scores
            alone = augmented[:, :n].amax(-1) - truth[:, :n]  # [N, n]
            twos = Potentials(augmented[:, n:].reshape(-1, E, 2, 2), pair[None, :, None].expand(len(y), E, 1, 2, 2),
                              Graph.chain(2))
            pair_truth = pair[torch.arange(E), y[:, n::2], y[:, n + 1::2]]  # [N, E]
            hinge = torch.cat([alone, tree_map(twos)[0] - truth[:, n:].reshape(-1, E, 2).sum(-1) - pair_truth], 1)
            weight = energy.unary.weight[0].pow(2).sum(-1) + rho * energy.unary.bias[0].pow(2)  # [L]
            reg = torch.cat([weight[:n], weight[n:].view(E, 2).sum(-1) + energy.edge_weight[0].pow(2)])
        return lam / 2 * reg + hinge.mean(0)


class Greedy(_StructureSearch):
    """CRANK's Greedy baseline: from the empty model, add the edge whose addition lowers the (certified)
    training objective most while keeping a forest, until no edge lowers it or the tree spans all labels.

    Each step trains every candidate (the current forest plus one edge) as one model of a batch, all started
    from the current forest's certified optimum (the new edge at 0, so each starts at the current objective)
    for ``search_iters`` L-BFGS iterations, and ranks them by their objective; the best one is trained on to
    its certificate (the next step's start) and added if its certified objective is below the current one. A run
    whose time budget is spent (``trainer.time_budget``) keeps the forest found so far.

    Args:
        search_iters: L-BFGS iterations per candidate of a step (from the common start).
        Other args as ``FixedTree``.
    """

    def __init__(self, num_features: int, num_labels: int, search_iters: int = 50, **kwargs) -> None:
        check_int(search_iters, "Greedy: search_iters", 1)
        super().__init__(num_features, num_labels, **kwargs)
        self.save_hyperparameters({"search_iters": search_iters})

    def build_structure(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        graph = self.energy.graph
        forest = torch.zeros(graph.num_edges, dtype=torch.bool)
        chosen = self._train(x, y, forest[None])
        self.search_log = [{"edges": 0, "objective": float(chosen.last.primal[0])}]
        while True:
            if out_of_time():
                log.warning("Greedy: the run's time budget is spent; the search stops at %d edges", int(forest.sum()))
                return forest
            grown = forest[None] | torch.eye(graph.num_edges, dtype=torch.bool)
            candidates = (~forest & (circuit_rank(grown, graph) == 0)).nonzero()[:, 0]  # edges that keep a forest
            if not len(candidates):
                return forest
            ranked = self._train(x, y, grown[candidates], (chosen, 0), self.hparams.search_iters)
            best = int(ranked.last.primal.argmin())
            certified = self._train(x, y, grown[candidates[best]][None], (ranked, best))
            if float(certified.last.primal[0]) >= float(chosen.last.primal[0]):
                return forest
            forest[candidates[best]] = True
            chosen = certified
            self.search_log.append({"edges": int(forest.sum()), "objective": float(chosen.last.primal[0]),
                                    "added": graph.edges[candidates[best]].tolist(),
                                    "ranked": float(ranked.last.primal[best])})
            log.info("Greedy: added %s of %d candidates, objective %.6g", self.search_log[-1]["added"],
                     len(candidates), self.search_log[-1]["objective"])


class Full(M3N):
    """Full baseline of CRANK: the Finley-Joachims energy on the complete label graph.

    Training: structured hinge whose loss-augmented max is the entropy-smoothed LP value
    (``smoothed_lp``, an upper bound, so the loss upper-bounds the LP-relaxed hinge), with each
    training example's messages warm-started from the previous epoch. Prediction: smoothed LP at
    ``predict_eps`` decoded by node pseudo-marginals, or the exact LP (``test_inference="lp_map"``,
    scipy HiGHS, CPU, per example).

    Args:
        eps / iters / lp_tol: smoothing, sweeps and stopping tolerance of the training inference (the
            Adam path's warm-started ``smoothed_lp``; solver="lbfgs" lowers eps itself, solver="bcfw" uses
            eps as its oracle's smoothing).
        predict_eps / predict_iters: the same for prediction (cold start).
        test_inference: "smoothed_lp" or "lp_map". Other args as ``M3N`` (model.candidates: the graph of each
            label's most dependent partners instead of the complete graph once the labels are many).
    """

    searches_structure = True

    def __init__(self, num_features: int, num_labels: int, eps: float = 0.01, iters: int = 20, lp_tol: float = 1e-4,
                 predict_eps: float = 0.005, predict_iters: int = 300, test_inference: str = "smoothed_lp",
                 **kwargs) -> None:
        if test_inference not in ("smoothed_lp", "lp_map"):
            raise ValueError(f"Full: test_inference must be 'smoothed_lp' or 'lp_map', got {test_inference!r}")
        super().__init__(num_features, num_labels, test_inference=self._predict_labels, **kwargs)
        self.save_hyperparameters({"test_inference": test_inference})
        self.example_state = self._message_state()

    def build_energy(self) -> FinleyJoachimsEnergy:
        return self.m3n_energy(self.label_graph(), self.num_models)

    def set_candidates(self, graph: Graph) -> None:
        super().set_candidates(graph)
        self.example_state = self._message_state().to(self.device)

    def _message_state(self) -> ExampleState:
        """Warm-start messages [N_train, E, 2, K] of the energy's graph (checkpointed, identical on every process)."""
        state = ExampleState()
        state.add("messages", (self.energy.graph.num_edges, 2, 2))
        return state

    def smoothed_max(self) -> SmoothedMax:
        """The smoothed LP relaxation (cold start, ``predict_iters`` sweeps): certifies the LP-relaxed hinge."""
        return LPSmoothedMax(self.hparams.predict_iters, tol=self.hparams.lp_tol)

    def bcfw_oracle(self) -> Oracle:
        return smoothed_oracle(self.hparams.eps, self.hparams.predict_iters, tol=self.hparams.lp_tol * self.hparams.eps)

    def loss(self, pot: Potentials, y: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """The smoothed-LP hinge [B], warm-started from each example's messages of the previous epoch."""
        return self.warm_smoothed_hinge(pot, y, index, self.hparams.eps, self.hparams.iters, self.hparams.lp_tol)

    def _predict_labels(self, pot: Potentials) -> torch.Tensor:
        hp = self.hparams
        if hp.test_inference == "lp_map":
            return lp_map(pot).assignment
        return smoothed_lp(pot, hp.predict_eps, hp.predict_iters, tol=hp.lp_tol * hp.predict_eps / hp.eps).assignment
