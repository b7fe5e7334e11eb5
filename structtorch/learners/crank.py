"""CRANK: max-margin tree predictors by circuit-rank regularisation (Meshi, Eban, Elidan, Globerson, UAI 2013).

The Finley-Joachims energy on the complete label graph, trained by CCCP (Algorithm 1,
``structtorch.strategies.CCCP``) on l(w) + beta f(|w_pair|) from ``restarts`` starting points at once; the restart
with the lowest objective among those whose support is a forest predicts, restricted to that forest, by exact
``tree_map``. Project (Sec. 6) runs the same algorithm from Full's certified weights with a large beta.

CCCP searches within half of the time budget; on a training set of more than ``search_rows`` rows (or one whose
restarts x rows x candidate edges would exceed ``MAX_EDGE_ROWS`` per smoothed-LP evaluation) on a seeded subset of
the rows. The forest it ends on (the maximum spanning forest of |w_pair| over the best restart's support when that
is not yet a forest) is then retrained on every row to its certificate with exact tree inference
(``train_forests``, from Independent's solution), as MST's and Greedy's searches are: that model predicts.

One Lightning epoch = one CCCP iteration; logged: train/objective, train/beta, train/circuit_rank,
train/nonzero_edges (of the best restart), and train/forests (restarts whose support is a forest).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..energies import FinleyJoachimsEnergy
from ..folds import rows_at_most
from ..graph import Graph, check_float, check_int
from ..inference import tree_map
from ..potentials import Potentials
from ..progress import phase
from ..strategies import CCCP
from ..strategies.certified import lbfgs_dtype
from .baselines import Full, train_forests

__all__ = ["CRANK", "MAX_EDGE_ROWS", "Project"]

log = logging.getLogger(__name__)

#: restarts x search rows x candidate edges of one smoothed-LP evaluation of CRANK's search at most: bounds its
#: memory (about 290 bytes each: 1.2 GB) and time (about 45 s on the 2-core CPU at 300 sweeps, from the fused
#: kernel's measured 10,000 problems x 139 edges in 14.7 s)
MAX_EDGE_ROWS = 2**22


class CRANK(Full):
    """CRANK (Alg. 1) with R random restarts as one batched model.

    Args:
        beta: the initial weight of the circuit-rank regulariser (> 0).
        beta_growth: factor on beta when the CCCP objective stalls while some support has cycles (> 1).
        cccp_tol: a CCCP iteration "stalls" when it lowers h by less than cccp_tol * |h|.
        inner_iters: FISTA iterations per CCCP iteration at most.
        restarts: R starting points (paper: 10 random ones); restart 0 starts at Independent's solution (couplings 0;
            at w = 0 with ``independent_start=false``), the others at random.
        init_scale: standard deviation of the random starting weights.
        seed: seed of the starting points.
        eps / predict_iters: the smoothed LP of the training hinge (temperature, sweeps; lp_tol as Full's: at its
            1e-2 rather than 1e-4, CRANK on scene became stationary in 144 s instead of stopping at its 274 s share
            of the budget, with the same test accuracies). Its entropy adds up to eps (n log K + E log K^2) to
            each example's loss: 12.5 at eps = 0.05 on the complete graph of 19 labels (birds), where CRANK then
            predicted too few labels; hence 0.005.
        search_rows: CCCP searches on at most this many training rows (a seeded subset; None: all, up to
            ``MAX_EDGE_ROWS``); its forest is then retrained on every row.
        Other args as ``Full`` (prediction while the support still has cycles) and ``StructuredLearner``;
        ``l2`` is one number (the restarts are the batch dimension).
    """

    def __init__(self, num_features: int, num_labels: int, beta: float = 1e-3, beta_growth: float = 2.0,
                 cccp_tol: float = 1e-3, inner_iters: int = 100, restarts: int = 10, init_scale: float = 0.1,
                 seed: int = 0, eps: float = 0.005, search_rows: int | None = 2000, **kwargs) -> None:
        for name, v, low in (("beta", beta, 0.0), ("beta_growth", beta_growth, 1.0), ("cccp_tol", cccp_tol, 0.0)):
            check_float(v, f"CRANK: {name}", low)
        check_float(init_scale, "CRANK: init_scale", 0.0, strict=False)
        if search_rows is not None:
            check_int(search_rows, f"{type(self).__name__}: model.search_rows", 2, expected="None or an int >= 2")
        for name, v in (("inner_iters", inner_iters), ("restarts", restarts)):
            check_int(v, f"CRANK: {name}", 1)
        super().__init__(num_features, num_labels, eps=eps, **kwargs)
        self.save_hyperparameters({"search_rows": search_rows})
        if self.num_models is not None:
            raise ValueError("CRANK: model.l2 must be one number (its restarts are the batched models)")
        self.restart_energy = self._starting_points()  # [R] models, checkpointed
        self.register_buffer("beta", torch.tensor(float(beta), dtype=torch.float64))
        self.register_buffer("best", torch.tensor(0))
        self.register_buffer("last_objective", torch.full((restarts,), float("inf"), dtype=torch.float64))

    def _starting_points(self) -> FinleyJoachimsEnergy:
        hp = self.hparams
        energy = self.m3n_energy(self.search_graph(self.candidates), hp.restarts).to(torch.float64)
        gen = torch.Generator().manual_seed(hp.seed)
        with torch.no_grad():
            for p in energy.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * hp.init_scale)
                p[0] = 0.0
        return energy

    def set_candidates(self, graph: Graph) -> None:
        super().set_candidates(graph)
        self.restart_energy = self._starting_points().to(self.device)

    def build_strategy(self) -> CCCP:
        return CCCP(self)

    @property
    def solver_name(self) -> str:
        return "cccp"

    def search_subset(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows CCCP searches on: at most ``search_rows`` of x [N, D], y [N, n], and at most
        ``MAX_EDGE_ROWS`` / (restarts x candidate edges) (a seeded subset; the forest found trains on every row)."""
        per_row = self.hparams.restarts * max(1, self.restart_energy.graph.num_edges)
        size = min(self.hparams.search_rows or len(x), max(2, MAX_EDGE_ROWS // per_row))
        x, y, note = rows_at_most(x, y, size, "model.search_rows" if size == self.hparams.search_rows else
                                  f"{MAX_EDGE_ROWS} restarts x rows x candidate edges at most")
        if note:
            log.info("%s: CCCP searches%s", type(self).__name__, note)
        return x, y

    def refit_forest(self, x: torch.Tensor, y: torch.Tensor, forest: torch.Tensor,
                     start: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> dict[str, Any]:
        """The M3N on ``forest`` (bool [E] over the candidate graph) trained on x [N, D], y [N, n] to its
        certificate with exact tree inference (``train_forests``, in L-BFGS's precision: ``lbfgs_dtype``) becomes the
        predictor; returns that certificate.
        start: (unary weights [n, D], biases [n], their objective [1], about) it starts at, couplings 0
        (``CCCP.refit_start``: Independent's solution, as FixedTree's fit starts)."""
        hp, graph, forest = self.hparams, self.restart_energy.graph, forest.cpu()
        own = Graph.from_mask(forest, graph)  # trained on its own edges: no masked candidate edges in the passes
        w, b, objective = start
        initial = self.m3n_energy(own, 1).to(torch.float64)
        with torch.no_grad():
            initial.unary.weight.copy_(w)
            initial.unary.bias.copy_(b)
            initial.edge_weight.zero_()
        with phase(f"{type(self).__name__}: its forest of {own.num_edges} edges retrained on {len(x)} rows"):
            solver = train_forests(x.cpu(), y.cpu(), torch.ones(1, own.num_edges, dtype=torch.bool),
                                   self.l2_grid[0], self.bias_reg, hp.tol, hp.margin_scale, spin=self.spin, graph=own,
                                   weights=(initial, objective.cpu()), dtype=lbfgs_dtype(len(x), own))
        wide = self.m3n_energy(graph, 1).to(torch.float64)  # its weights laid out on the candidate graph
        with torch.no_grad():
            for (name, p), q in zip(wide.named_parameters(), solver.target.parameters()):
                if name == "edge_weight":
                    p[:, forest] = q
                else:
                    p.copy_(q)
        self.use_restart(0, forest, wide)
        return {"rows": len(x), "relative_gap": float(solver.last.relative_gap[0]),
                "converged": bool(solver.last.converged[0]), "tol": hp.tol}

    def use_restart(self, b: int, tree: torch.Tensor | None, source: FinleyJoachimsEnergy | None = None) -> None:
        """Model b of ``source`` (default: restart b) predicts: its weights go into the predicting energy (one
        model), restricted to ``tree`` (bool [E], restart b's support when it is a forest: exact ``tree_map``),
        else on the complete graph. Called in the training step, so each checkpoint (written at its epoch's end)
        holds that epoch's predictor."""
        if self.structure_mask.numel():  # restricted by an earlier iteration or by the checkpoint resumed
            self.reset_structure()
        source = self.restart_energy if source is None else source
        with torch.no_grad():
            for p, q in zip(self.energy.parameters(), source.parameters()):
                p.copy_(q[b])
        if tree is not None:
            self.set_structure(tree)

    # ------------------------------------------------------------------ prediction
    def _predict_labels(self, pot: Potentials) -> torch.Tensor:
        if pot.graph.is_forest:
            return tree_map(pot)[1]
        return super()._predict_labels(pot)


class Project(CRANK):
    """CRANK's Project baseline (Sec. 6): CRANK started from Full's weights (the certified smoothed-LP hinge
    optimum on the complete graph) with a large beta, so the first CCCP iteration keeps only the maximum
    spanning tree of |w_full| (footnote 7: a "tree projection" of Full) and retrains on it.

    Args: as ``CRANK``, with beta = 10 and one restart by default.
    """

    def __init__(self, num_features: int, num_labels: int, beta: float = 10.0, restarts: int = 1,
                 **kwargs) -> None:
        super().__init__(num_features, num_labels, beta=beta, restarts=restarts, **kwargs)

    def build_strategy(self) -> CCCP:
        return CCCP(self, from_full=True)
