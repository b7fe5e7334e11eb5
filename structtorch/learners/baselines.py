"""Baseline learners: Independent (Empty), FixedTree (M3N on a given tree, e.g. Chow-Liu), Full
(complete graph, LP relaxation), and CRANK's structure-search baselines Greedy and MST (Sec. 6)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..energies import FinleyJoachimsEnergy
from ..folds import rows_at_most
from ..graph import Graph, check_bool, check_int
from ..inference import lp_map, smoothed_lp, tree_map
from ..potentials import Potentials
from ..progress import budget_share, out_of_time
from ..solvers import ForestSmoothedMax, LPSmoothedMax, Oracle, SmoothedLBFGS, SmoothedMax, smoothed_oracle
from ..solvers.dcd import available as dcd_available
from ..state import ExampleState
from ..strategies import DCDStrategy
from ..structure import max_spanning_tree
from ..structure.edge_scores import candidate_graph, chow_liu_tree, dependence_order
from .base import START_SHARE, StructuredLearner

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
        independent_start: a certified L-BFGS fit on a graph with edges starts at Independent's solution (its
            one linear SVM per label to a 1% gap, ``independent_svms``), the couplings at 0, instead of at 0.
        Other args as ``StructuredLearner``.
    """

    #: True for learners that choose their edges among candidates (Full, CRANK, Project, Greedy, MST)
    searches_structure = False

    def __init__(self, num_features: int, num_labels: int, spin: bool = True, candidates: int | None = 10,
                 independent_start: bool = True, **kwargs) -> None:
        if candidates is not None:
            check_int(candidates, "model.candidates", 1, expected="None or an int >= 1")
        check_bool(independent_start, "model.independent_start")
        self.spin, self.candidates = spin, candidates  # read by build_energy, called in StructuredLearner.__init__
        super().__init__(num_features, num_labels, **kwargs)
        self.save_hyperparameters({"spin": spin, "candidates": candidates, "independent_start": independent_start})

    def m3n_energy(self, graph: Graph, num_models: int | None) -> FinleyJoachimsEnergy:
        """The Finley-Joachims energy of these features and labels on ``graph``."""
        return FinleyJoachimsEnergy(self.hparams.num_features, self.hparams.num_labels, graph, num_models=num_models,
                                    spin=self.spin)

    def build_candidates(self, x: torch.Tensor, y: torch.Tensor) -> Graph | None:
        """Each label's ``candidates`` most dependent partners (``candidate_graph``) for a structure search."""
        return candidate_graph(y, self.candidates) if self.searches_structure else None

    def warm_start(self, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor, mask: torch.Tensor | None
                   ) -> torch.Tensor | None:
        """With ``independent_start`` and edges: Independent's solution, the couplings at 0 (the model then scores
        as Independent's does, and the fit goes on from there). At bibtex's size (159 labels, 1,836 features) Full's
        time budget ended 165 L-BFGS iterations from 0 at 30 points of subset accuracy below Independent."""
        start = self.independent_solution(x, y, lam, mask) if self.energy.graph.num_edges else None
        if start is None:
            return None
        w, b, objective = start  # [M, n, D], [M, n]
        self._set_weights(w if self.num_models else w[0], b if self.num_models else b[0], torch.zeros(()))
        return objective

    def _set_weights(self, w: torch.Tensor, b: torch.Tensor, edge: torch.Tensor) -> None:
        """The energy's unary weights, biases and coupling weights, each broadcast to its parameter's shape."""
        energy = self.energy
        with torch.no_grad():
            energy.unary.weight.copy_(w.expand_as(energy.unary.weight))
            energy.unary.bias.copy_(b.expand_as(energy.unary.bias))
            energy.edge_weight.copy_(edge.expand_as(energy.edge_weight))


class Independent(M3N):
    """Empty structure: one linear max-margin classifier per label (CRANK's Empty baseline). ``solver="auto"`` takes
    solver="dcd" (liblinear's dual coordinate descent, ``DualCD``) for the hinge with the Hamming margin where the
    fused CPU kernels build, else as ``StructuredLearner``: on delicious it certified (1e-3) where L-BFGS ended the
    time budget at a relative gap of 0.32."""

    def build_energy(self) -> FinleyJoachimsEnergy:
        return self.m3n_energy(Graph.empty(self.hparams.num_labels), self.num_models)

    @property
    def solver_name(self) -> str:
        if self.hparams.solver == "auto" and DCDStrategy.solves(self) and dcd_available():
            return "dcd"
        return super().solver_name


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
                  iterations: int | None = None, spin: bool = False, graph: Graph | None = None,
                  weights: tuple[FinleyJoachimsEnergy, torch.Tensor] | None = None,
                  dtype: torch.dtype = torch.float64) -> SmoothedLBFGS:
    """M3N on each of M forests, all trained as one batched model to a relative duality gap <= tol.

    x [N, D], y [N, n] long; forests: bool [M, E] over ``graph``'s edges (default ``Graph.complete(n)``), each
    row a forest.
    start: (solver, m) of an earlier call: every model starts from its model m (weights, zero on the edges
    outside m's forest, and temperature), e.g. a forest grown by one edge starts from the forest's
    optimum. weights: (a one-model energy on ``graph``, about its objective [1]) to start every model at, at a
    temperature low enough to keep it (``SmoothedLBFGS.start_near_optimum``). iterations: instead of certifying at
    tol, that many L-BFGS iterations at the starting temperature, then one certificate. spin: as
    ``FinleyJoachimsEnergy``. dtype: what L-BFGS computes in (``lbfgs_dtype``). Returns the solver (``.last``: the
    certificate [M], ``.target``: the weights in float64, ``.energy``: in dtype; exact tree inference per model:
    ``ForestSmoothedMax``)."""
    n = y.shape[1]
    graph = Graph.complete(n) if graph is None else graph
    energy = FinleyJoachimsEnergy(x.shape[1], n, graph, num_models=forests.shape[0], spin=spin).to(torch.float64)
    energy.edge_mask.copy_(forests)
    source, m = (start[0].energy, start[1]) if start is not None else (weights[0], 0) if weights else (None, 0)
    if source is not None:
        with torch.no_grad():
            for p, q in zip(energy.parameters(), source.parameters()):
                p.copy_(q[m].expand_as(p))
            energy.edge_weight.mul_(source.edge_mask[m])
    smax = ForestSmoothedMax(forests, graph)
    solver = SmoothedLBFGS(energy, x, y, lam, smoothed_max=smax, exact_max=smax.exact, margin_scale=margin_scale,
                           bias_reg=bias_reg, tol=tol, dtype=dtype)
    if start is not None:
        solver.eps = start[0].eps[start[1]].expand_as(solver.eps).clone()
    elif weights is not None:
        solver.start_near_optimum(weights[1].to(solver.eps).expand_as(solver.eps))
    return solver.solve(iterations)


def forest_objectives(x: torch.Tensor, y: torch.Tensor, forests: torch.Tensor, lam: float, bias_reg: float = 1e-4,
                      tol: float = 1e-3, margin_scale: float = 1.0, spin: bool = False) -> torch.Tensor:
    """The certified optimum of the M3N objective on each of M forests (``train_forests`` from w = 0): the
    primal objective [M] (float64) at a relative duality gap <= tol. spin: as ``FinleyJoachimsEnergy``."""
    return train_forests(x, y, forests, lam, bias_reg, tol, margin_scale, spin=spin).last.primal


class _StructureSearch(FixedTree):
    """A FixedTree whose tree is found by training forests of the candidate graph (CRANK's Sec. 6 baselines).

    Args:
        search_rows: the search's models train on at most this many training rows (a seeded subset, ``rows_at_most``;
            None: all), the chosen forest on every row. Other args as ``FixedTree``.
    """

    searches_structure = True
    set_up_reports = (*FixedTree.set_up_reports, "search_log")

    def __init__(self, num_features: int, num_labels: int, search_rows: int | None = 2000, **kwargs) -> None:
        if search_rows is not None:
            check_int(search_rows, f"{type(self).__name__}: model.search_rows", 2, expected="None or an int >= 2")
        super().__init__(num_features, num_labels, **kwargs)
        if self.num_models is not None:
            raise ValueError(f"{type(self).__name__}: model.l2 must be one number (the search trains candidate "
                             f"forests as the batched models)")
        self.save_hyperparameters({"search_rows": search_rows})
        self.search_log: list[dict] = []

    def search_subset(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows the search trains on: at most ``search_rows`` of x [N, D], y [N, n] (the chosen forest trains
        on every row)."""
        x, y, note = rows_at_most(x, y, self.hparams.search_rows, "model.search_rows")
        if note:
            log.info("%s: structure search%s", type(self).__name__, note)
        return x, y

    def build_energy(self) -> FinleyJoachimsEnergy:
        return self.m3n_energy(self.search_graph(self.candidates), self.num_models)

    def structure_summary(self) -> dict:
        """The learned tree and the search that found it (objectives per step / per edge)."""
        return {**super().structure_summary(), "search": self.search_log}


class ComponentModels:
    """M3N models of G label components (each a forest over some labels) as one forest of label copies: copy c
    predicts label ``copies[c]``, each component's copies joined by its own edges, so one ``SmoothedLBFGS`` trains
    them all and the objective of the union is the sum of theirs (the l2 term and the Hamming-margin hinge split
    over connected components). Costs the components' total size in labels, not G x n.

    Args:
        groups: G pairs (labels LongTensor [s_g], edges LongTensor [k_g, 2] of label ids, a forest on those labels).
        num_labels: n, the labels' number (ids in [0, n)).
    """

    def __init__(self, groups: list[tuple[torch.Tensor, torch.Tensor]], num_labels: int) -> None:
        sizes = torch.tensor([len(labels) for labels, _ in groups])
        offsets = torch.cumsum(sizes, 0) - sizes
        slot = torch.full((len(groups), num_labels), -1, dtype=torch.long)  # group g's copy of label i
        for g, (labels, _) in enumerate(groups):
            slot[g, labels] = offsets[g] + torch.arange(len(labels))
        self.copies = torch.cat([labels for labels, _ in groups])  # [L]
        self.group_of_copy = torch.repeat_interleave(torch.arange(len(groups)), sizes)  # [L]
        edges = [slot[g][e.reshape(-1, 2)] for g, (_, e) in enumerate(groups)]
        self.group_of_edge = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(e) for e in edges]))
        self.edge_labels = torch.cat([e.reshape(-1, 2) for _, e in groups])  # [K, 2] label ids
        self.graph = Graph(len(self.copies), torch.cat(edges))
        self.num_groups = len(groups)

    def train(self, learner: M3N, x: torch.Tensor, y: torch.Tensor, start: tuple[torch.Tensor, ...] | None = None,
              iterations: int | None = None, eps: float | None = None, objective: torch.Tensor | None = None
              ) -> SmoothedLBFGS:
        """The copies' model trained with ``learner``'s settings (l2, bias_reg, tol, margin, spin) on x [N, D], y
        [N, n]: to its certificate, or ``iterations`` L-BFGS iterations then one certificate. start: (W [n, D],
        b [n], pair weights [n, n]) per label and label pair, copied to every copy (default zeros); eps: the
        starting temperature (default the margin: a cold start), e.g. that of the certified model it starts from;
        objective: instead, about the start's objective [1], for a temperature that keeps it
        (``SmoothedLBFGS.start_near_optimum``)."""
        hp = learner.hparams
        energy = FinleyJoachimsEnergy(x.shape[1], len(self.copies), self.graph, spin=learner.spin).to(torch.float64)
        if start is not None:
            W, b, pair = start
            with torch.no_grad():
                energy.unary.weight.copy_(W[self.copies])
                energy.unary.bias.copy_(b[self.copies])
                energy.edge_weight.copy_(pair[self.edge_labels[:, 0], self.edge_labels[:, 1]])
        solver = SmoothedLBFGS(energy, x.to(torch.float64), y[:, self.copies], learner.l2_grid[0],
                               margin_scale=hp.margin_scale, bias_reg=learner.bias_reg, tol=hp.tol)
        if eps is not None:
            solver.eps.fill_(eps)
        elif objective is not None:
            solver.start_near_optimum(objective)
        return solver.solve(iterations)

    def objectives(self, solver: SmoothedLBFGS, bias_reg: float) -> torch.Tensor:
        """Each component's M3N objective [G] (float64) at the solver's weights: l2 on its weights (``bias_reg``
        on biases) plus its mean hinge with the exact loss-augmented max (the union's argmax, split by component)."""
        energy, y, lam = solver.energy, solver.y, solver.lam[0]
        with torch.no_grad():
            pot = energy(solver.x)  # unary [N, L, 2], pairwise [K, 2, 2]
            augmented = pot.unary + solver.delta
            y_hat = tree_map(Potentials(augmented, pot.pairwise, self.graph))[1]  # [N, L]: each component's argmax
            node = augmented.gather(-1, y_hat[..., None])[..., 0] - pot.unary.gather(-1, y[..., None])[..., 0]
            e = self.graph.edges
            k = torch.arange(len(e))
            edge = pot.pairwise[k, y_hat[:, e[:, 0]], y_hat[:, e[:, 1]]] - pot.pairwise[k, y[:, e[:, 0]], y[:, e[:, 1]]]
            hinge = node.new_zeros(len(y), self.num_groups).index_add_(1, self.group_of_copy, node)
            hinge.index_add_(1, self.group_of_edge, edge)
            reg = energy.unary.weight.pow(2).sum(-1) + bias_reg * energy.unary.bias.pow(2)
            reg = reg.new_zeros(self.num_groups).index_add_(0, self.group_of_copy, reg)
            reg.index_add_(0, self.group_of_edge, energy.edge_weight.pow(2))
        return lam / 2 * reg + hinge.mean(0)


#: label copies x training rows per batch of ``train_components``: bounds the memory of MST's and Greedy's batched
#: models (measured: about 430 bytes per copy and row, so about 1.8 GB), e.g. 360 copies at N = 11,628
MAX_COPY_ROWS = 2**22


def train_components(learner: M3N, x: torch.Tensor, y: torch.Tensor, groups: list[tuple[torch.Tensor, torch.Tensor]],
                     **train: Any) -> tuple[torch.Tensor, float]:
    """Each group's M3N objective [G] (float64, ``ComponentModels.objectives``) after ``ComponentModels.train``
    (keyword args ``train``), consecutive groups batched up to ``MAX_COPY_ROWS / N`` label copies (at least one
    group), and the largest relative duality gap of the batches. The objective splits over components, so
    batching does not change it. Once the run's time budget is spent, the groups not yet trained get NaN."""
    objectives, gap, batch, size = [], 0.0, [], 0
    most = MAX_COPY_ROWS // len(x)
    for g, group in enumerate(groups):
        batch.append(group)
        size += len(group[0])
        if g + 1 == len(groups) or size + len(groups[g + 1][0]) > most:
            if out_of_time():
                objectives.append(torch.full((len(batch),), float("nan"), dtype=torch.float64, device=x.device))
            else:
                models = ComponentModels(batch, learner.hparams.num_labels)
                solver = models.train(learner, x, y, **train)
                objectives.append(models.objectives(solver, learner.bias_reg))
                gap = max(gap, float(solver.last.relative_gap.max()))
            batch, size = [], 0
    return (torch.cat(objectives) if objectives else x.new_zeros(0, dtype=torch.float64)), gap


class MST(_StructureSearch):
    """CRANK's MST baseline: the objective gain of each candidate edge alone over the empty model, the maximum
    spanning tree of those gains, then M3N on that tree.

    The gain of edge (i, j) is obj_i + obj_j - obj_ij: the empty model's objectives of labels i and j alone less
    the objective of the two-label model on (i, j) (the objective splits over components). Every label alone and
    every candidate edge's pair are one ``ComponentModels`` (n + 2E label copies), trained once to its certificate.
    """

    def build_structure(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        graph = self.energy.graph
        x, y = self.search_subset(x, y)
        n, none = graph.num_nodes, torch.zeros(0, 2, dtype=torch.long)
        order = dependence_order(y, graph).cpu()
        groups = [(torch.tensor([i]), none) for i in range(n)] + [(e, e[None]) for e in graph.edges[order]]
        objective, gap = train_components(self, x, y, groups)  # [n + E]: each label alone, then each pair
        gains = torch.full((graph.num_edges,), float("-inf"), dtype=torch.float64)
        gains[order] = (objective[graph.edges[order]].sum(1) - objective[n:]).cpu().nan_to_num(float("-inf"))
        self.search_log = [{"empty": float(objective[:n].sum()), "certificate": gap,
                            "gains": [g if g > float("-inf") else None for g in gains.tolist()]}]
        return (max_spanning_tree(gains, graph) & gains.isfinite()).cpu()  # pairs not trained in the budget: no edge


class Greedy(_StructureSearch):
    """CRANK's Greedy baseline: from the empty model, add the edge whose addition lowers the (certified)
    training objective most while keeping a forest, until no edge lowers it or the tree spans all labels.

    The objective splits over the forest's components, so adding edge (i, j) between components A and B changes
    it by obj(A + B + (i, j)) - obj(A) - obj(B): each candidate is the model of the merged component only
    (``ComponentModels``), started from the current weights (the new edge at 0) for ``search_iters`` L-BFGS
    iterations, and ranked by that gain; the best one is trained on to its certificate and added if its certified
    objective is below obj(A) + obj(B). Gains are kept between steps and recomputed only for the candidates that
    touch the merged component. A run whose time budget is spent (``trainer.time_budget``) keeps the forest found
    so far. The empty model (every label alone: Independent's) starts at Independent's solution (``independent_start``):
    at rcv1subset's shape (47,236 features) its L-BFGS from 0 spent the budget uncertified, and Greedy ended at 0
    edges with 6.17 / 37.84 subset / example F1 against Independent's 12.03 / 52.92. From that start, its certificate
    takes at most ``START_SHARE`` of the time left: on delicious (983 labels) it had taken the search's whole share.

    Args:
        search_iters: L-BFGS iterations per candidate of a step (from the current weights).
        Other args as ``FixedTree``.
    """

    def __init__(self, num_features: int, num_labels: int, search_iters: int = 50, **kwargs) -> None:
        check_int(search_iters, "Greedy: search_iters", 1)
        super().__init__(num_features, num_labels, **kwargs)
        self.save_hyperparameters({"search_iters": search_iters})

    def build_structure(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        forest, weights = self._search(*self.search_subset(x, y))
        self._warm_start(weights)
        return forest

    def warm_start(self, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor, mask: torch.Tensor | None
                   ) -> torch.Tensor | None:
        """The fit starts from the search's models (``_warm_start``), already at or below Independent's objective:
        their objective [1] (the search's last, on its rows), so the fit starts at a temperature that keeps them. At
        rcv1subset's shape, from the margin's temperature, its L-BFGS moved off the search's model (Independent's)
        and ended the budget at 9.50 / 48.37 subset / example F1 (Independent 12.03 / 52.92)."""
        return torch.tensor([self.search_log[-1]["objective"]], dtype=torch.float64) if self.search_log else None

    def _warm_start(self, weights: tuple[torch.Tensor, ...]) -> None:
        """Start the final fit from the search's certified component models (W [n, D], b [n], pair [n, n]):
        together they are the forest's model (the objective splits over components), so the fit starts near its
        optimum, and a run whose time budget the search spent predicts with them instead of with zeros."""
        W, b, pair = weights
        i, j = self.energy.graph.edges.T
        self._set_weights(W, b, pair[i, j])

    def _search(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The greedy forest [E] (bool over the candidate graph) and its component models' weights."""
        graph = self.energy.graph
        n, edges = graph.num_nodes, graph.edges
        component = torch.arange(n)  # each label's component, named by one of its labels
        forest = torch.zeros(graph.num_edges, dtype=torch.bool)
        alone = ComponentModels([(torch.tensor([i]), torch.zeros(0, 2, dtype=torch.long)) for i in range(n)], n)
        zeros = (torch.zeros(n, x.shape[1], dtype=torch.float64), torch.zeros(n, dtype=torch.float64),
                 torch.zeros(n, n, dtype=torch.float64))
        start = self.independent_solution(x, y, self.l2_grid[0], None)  # the empty model is Independent's
        if start is None:
            solver = alone.train(self, x, y)
        else:  # near its optimum already: its certificate may take a share of the time, the rest is the search's
            with budget_share(START_SHARE):
                solver = alone.train(self, x, y, start=(start[0][0].double(), start[1][0].double(), zeros[2]),
                                     objective=start[2])
        objective = alone.objectives(solver, self.bias_reg)  # [n]: of the component named by each label
        weights = self._label_weights(alone, solver, zeros)
        gains = torch.full((graph.num_edges,), float("nan"), dtype=torch.float64)
        eps = float(solver.eps.min())  # candidates start at the temperature of the certified model
        self.search_log = [{"edges": 0, "objective": float(objective.sum())}]
        while True:
            joins = component[edges[:, 0]] != component[edges[:, 1]]  # the edges that keep a forest
            if not bool(joins.any()):
                return forest, weights
            self._rank(x, y, (joins & gains.isnan()).nonzero()[:, 0], component, forest, objective, weights, eps, gains)
            if out_of_time():  # some candidates may be unranked (NaN)
                log.warning("Greedy: the run's time budget is spent; the search stops at %d edges", int(forest.sum()))
                return forest, weights
            best = int(torch.where(joins, gains, float("-inf")).argmax())
            models = ComponentModels([self._merged(best, component, forest)], n)
            certified = models.train(self, x, y, start=weights, eps=eps)
            a, b = component[edges[best]].tolist()
            merged = float(models.objectives(certified, self.bias_reg)[0])
            if merged >= float(objective[a] + objective[b]):
                return forest, weights
            forest[best] = True
            component[component == b] = a
            objective[a] = merged
            weights = self._label_weights(models, certified, weights)
            eps = min(eps, float(certified.eps.min()))
            gains[(component[edges] == a).any(1)] = float("nan")  # candidates touching the merged component
            self.search_log.append({"edges": int(forest.sum()), "objective": float(objective[component.unique()].sum()),
                                    "added": edges[best].tolist(), "candidates": int(joins.sum())})
            log.info("Greedy: added %s of %d candidates, objective %.6g", edges[best].tolist(), int(joins.sum()),
                     self.search_log[-1]["objective"])

    def _merged(self, e: int, component: torch.Tensor, forest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The component that adding edge e makes: its labels and its forest edges (label ids), e last."""
        edges = self.energy.graph.edges
        labels = torch.isin(component, component[edges[e]]).nonzero()[:, 0]
        inside = forest & torch.isin(edges[:, 0], labels)
        return labels, torch.cat([edges[inside], edges[e][None]])

    def _rank(self, x: torch.Tensor, y: torch.Tensor, stale: torch.Tensor, component: torch.Tensor,
              forest: torch.Tensor, objective: torch.Tensor, weights: tuple[torch.Tensor, ...], eps: float,
              gains: torch.Tensor) -> None:
        """gains[e] = obj(A) + obj(B) - obj(A + B + e) after ``search_iters`` iterations, for the ``stale``
        candidates (trained in batches, ``train_components``)."""
        edges = self.energy.graph.edges
        groups = [self._merged(e, component, forest) for e in stale.tolist()]
        merged, _ = train_components(self, x, y, groups, start=weights, iterations=self.hparams.search_iters, eps=eps)
        gains[stale] = objective[component[edges[stale]]].sum(1) - merged

    @staticmethod
    def _label_weights(models: ComponentModels, solver: SmoothedLBFGS, weights: tuple[torch.Tensor, ...]
                       ) -> tuple[torch.Tensor, ...]:
        """(W [n, D], b [n], pair [n, n]) with the labels and label pairs of ``models`` set from its trained copies."""
        W, b, pair = (t.clone() for t in weights)
        energy = solver.energy
        with torch.no_grad():
            W[models.copies] = energy.unary.weight.detach()
            b[models.copies] = energy.unary.bias.detach()
            i, j = models.edge_labels.T
            pair[i, j] = pair[j, i] = energy.edge_weight.detach()
        return W, b, pair


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
            eps as its oracle's smoothing). Every call is an upper bound whatever its sweeps, and each starts from
            the last call's messages, so a loose lp_tol costs no accuracy: at 1e-2 rather than 1e-4 Full on yeast
            took 1,140 L-BFGS iterations to its certificate instead of 940 but a quarter of the sweeps (14,064
            against 61,515): 32 s instead of 75 s, the same test accuracies (1e-3: 50 s); on scene half the sweeps.
        predict_eps / predict_iters: the same for prediction (cold start).
        test_inference: "smoothed_lp" or "lp_map". Other args as ``M3N`` (model.candidates: the graph of each
            label's most dependent partners instead of the complete graph once the labels are many).
    """

    searches_structure = True

    def __init__(self, num_features: int, num_labels: int, eps: float = 0.01, iters: int = 20, lp_tol: float = 1e-2,
                 predict_eps: float = 0.005, predict_iters: int = 300, test_inference: str = "smoothed_lp",
                 **kwargs) -> None:
        if test_inference not in ("smoothed_lp", "lp_map"):
            raise ValueError(f"Full: test_inference must be 'smoothed_lp' or 'lp_map', got {test_inference!r}")
        super().__init__(num_features, num_labels, test_inference=self._predict_labels, **kwargs)
        self.save_hyperparameters({"test_inference": test_inference})
        self.example_state = self._message_state()

    def build_energy(self) -> FinleyJoachimsEnergy:
        return self.m3n_energy(self.search_graph(self.candidates), self.num_models)

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
