"""CRANK: max-margin tree predictors by circuit-rank regularisation (Meshi, Eban, Elidan, Globerson, UAI 2013).

The Finley-Joachims energy on the complete label graph is trained on

    min_w  l(w) + beta f(|w_pair|),   f = circuit-rank surrogate (eq. 12) = ||w_pair||_1 - max_T sum_{e in T} |w_e|,

with l the l2-regularised structured hinge (Hamming margin; its loss-augmented max the entropy-smoothed LP
relaxation, ``LPSmoothedMax`` at temperature ``eps``: an upper bound of the LP-relaxed hinge within
eps * H_max). CCCP (Alg. 1): each outer iteration linearises the concave part at w_t (v of Prop. 4.3,
``cccp_linearization``) and minimises the convex h_t(w) = l(w) + beta ||w_pair||_1 - beta v^T w_pair by
FISTA, whose soft-threshold step gives exact zeros. beta grows by ``beta_growth`` whenever h stops
decreasing, until the support of w_pair is a forest. ``restarts`` random starting points are trained as
one batched model; the one with the lowest final objective predicts, restricted to its forest, by exact
``tree_map``.

One Lightning epoch = one CCCP iteration; logged: train/objective, train/beta, train/circuit_rank,
train/nonzero_edges (of the best restart), and train/forests (restarts whose support is a forest).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from ..energies import FinleyJoachimsEnergy
from ..graph import Graph
from ..inference import tree_map
from ..potentials import Potentials
from ..solvers import BatchedFISTA, LPSmoothedMax, SmoothedLBFGS
from ..structure import cccp_linearization, circuit_rank, circuit_rank_penalty
from .base import _training_tensors
from .baselines import Full

__all__ = ["CRANK", "Project"]


class CRANK(Full):
    """CRANK (Alg. 1) with R random restarts as one batched model.

    Args:
        beta: the initial weight of the circuit-rank regulariser (> 0).
        beta_growth: factor on beta when the CCCP objective stalls while some support has cycles (> 1).
        cccp_tol: a CCCP iteration "stalls" when it lowers h by less than cccp_tol * |h|.
        inner_iters: FISTA iterations per CCCP iteration at most.
        restarts: R random starting points (paper: 10); restart 0 starts at w = 0.
        init_scale: standard deviation of the random starting weights.
        seed: seed of the starting points.
        eps / predict_iters / lp_tol: the smoothed LP of the training hinge (temperature, sweeps, tolerance).
        Other args as ``Full`` (prediction while the support still has cycles) and ``StructuredLearner``;
        ``l2`` is one number (the restarts are the batch dimension).
    """

    def __init__(self, num_features: int, num_labels: int, beta: float = 1e-3, beta_growth: float = 2.0,
                 cccp_tol: float = 1e-3, inner_iters: int = 100, restarts: int = 10, init_scale: float = 0.1,
                 seed: int = 0, eps: float = 0.05, **kwargs) -> None:
        for name, v, low in (("beta", beta, 0.0), ("beta_growth", beta_growth, 1.0), ("cccp_tol", cccp_tol, 0.0),
                             ("init_scale", init_scale, -1e-300)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > low:
                raise ValueError(f"CRANK: {name} must be a number > {max(low, 0):g}, got {v!r}")
        for name, v in (("inner_iters", inner_iters), ("restarts", restarts)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"CRANK: {name} must be a positive int, got {v!r}")
        super().__init__(num_features, num_labels, eps=eps, **kwargs)
        if self.num_models is not None:
            raise ValueError("CRANK: model.l2 must be one number (its restarts are the batched models)")
        self.restart_energy = self._starting_points()  # [R] models, checkpointed
        self.register_buffer("beta", torch.tensor(float(beta), dtype=torch.float64))
        self.register_buffer("best", torch.tensor(0))
        self.register_buffer("last_objective", torch.full((restarts,), float("inf"), dtype=torch.float64))
        self.outer_iterations = 0
        self.done = False

    def _starting_points(self) -> FinleyJoachimsEnergy:
        hp = self.hparams
        energy = self.m3n_energy(Graph.complete(hp.num_labels), hp.restarts).to(torch.float64)
        gen = torch.Generator().manual_seed(hp.seed)
        with torch.no_grad():
            for p in energy.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * hp.init_scale)
                p[0] = 0.0
        return energy

    # ------------------------------------------------------------------ solver
    @property
    def solver_name(self) -> str:
        return "cccp"

    def _check_solver(self) -> None:
        if self.hparams.solver not in ("auto", "lbfgs"):
            raise ValueError(f"CRANK trains by CCCP with FISTA inner solves; model.solver must be auto, "
                             f"got {self.hparams.solver!r}")

    def on_fit_start(self) -> None:
        self._check_solver()
        hp = self.hparams
        x, y = _training_tensors(self.trainer)
        self.restart_energy.to(self.device)
        # the smoothed hinge l(w) [R] (objective() of a fixed-temperature SmoothedLBFGS; its L-BFGS is unused)
        self.hinge = SmoothedLBFGS(self.restart_energy, x.to(self.device), y.to(self.device), self.l2_grid[0],
                                   smoothed_max=LPSmoothedMax(hp.predict_iters, tol=hp.lp_tol), eps=hp.eps,
                                   margin_scale=hp.margin_scale, bias_reg=hp.bias_reg)
        self.v = torch.zeros_like(self.restart_energy.edge_weight)
        self.fista = BatchedFISTA(self.hinge.params, self._smooth, self._l1())
        self.solver = None

    def _l1(self) -> list[torch.Tensor | None]:
        return [self.beta.expand(self.hparams.restarts) if p is self.restart_energy.edge_weight else None
                for p in self.hinge.params]

    def _smooth(self) -> torch.Tensor:
        """The smooth part of h_t [R]: l(w) - beta v^T w_pair."""
        return self.hinge.objective() - self.beta * (self.v * self.restart_energy.edge_weight).sum(1)

    def crank_objective(self) -> torch.Tensor:
        """l(w) + beta f(|w_pair|) [R] (the objective CCCP decreases) at FISTA's iterate, no gradient: l is
        recovered from FISTA's h_t = l - beta v^T w + beta |w|_1 without another smoothed-LP evaluation."""
        w = self.restart_energy.edge_weight.detach()
        loss = self.fista.F - self.beta * (w.abs().sum(1) - (self.v * w).sum(1))
        return loss + self.beta * circuit_rank_penalty(w.abs(), self.restart_energy.graph)

    def _certified_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        if batch_idx != 0 or self.done:
            return None
        self.cccp_step()
        self.optimizers().step()
        return None

    def cccp_step(self) -> dict[str, Any]:
        """One CCCP iteration (Alg. 1) on all restarts, then the beta schedule; returns what it logs."""
        hp, graph = self.hparams, self.restart_energy.graph
        self.v = cccp_linearization(self.restart_energy.edge_weight.detach(), graph)  # Prop. 4.3
        self.fista.set_l1(self._l1())
        self.fista.run(hp.inner_iters)
        h = self.crank_objective()
        support = self.restart_energy.edge_weight.detach() != 0
        rank = circuit_rank(support, graph)
        stalled = (self.last_objective - h) <= hp.cccp_tol * h.abs()
        self.last_objective = h.clone()
        self.outer_iterations += 1
        forest = rank == 0
        ranked = torch.where(forest, h, float("inf")) if bool(forest.any()) else h  # forests first
        b = int(ranked.argmin())
        self.best.fill_(b)
        if bool(stalled.all()):
            if bool(forest.all()):
                self.done = True
            else:
                self.beta *= hp.beta_growth
                self.last_objective.fill_(float("inf"))
        self._predict_with(b, support[b] if bool(forest[b]) else None)
        stats = {"train/objective": float(h[b]), "train/beta": float(self.beta), "train/circuit_rank": float(rank[b]),
                 "train/nonzero_edges": float(support[b].sum()), "train/forests": float(forest.sum())}
        self.log_dict(stats, prog_bar=True, on_step=False, on_epoch=True)
        return stats

    def _predict_with(self, b: int, tree: torch.Tensor | None) -> None:
        """Restart b predicts: its weights go into the predicting energy (one model), restricted to ``tree``
        (bool [E], restart b's support when it is a forest: exact ``tree_map``), else on the complete graph.
        Called in the training step, so each checkpoint (written at its epoch's end) holds that epoch's
        predictor."""
        if self.structure_mask.numel():  # restricted by an earlier iteration or by the checkpoint resumed
            self.reset_structure()
        with torch.no_grad():
            for p, q in zip(self.energy.parameters(), self.restart_energy.parameters()):
                p.copy_(q[b])
        if tree is not None:
            self.set_structure(tree)

    def on_train_epoch_end(self) -> None:
        if self.done:
            self.trainer.should_stop = True

    def on_train_end(self) -> None:
        if not self.graph.is_forest:
            rank_zero_warn(f"CRANK stopped at max_epochs={self.trainer.max_epochs} before its support was a "
                           f"forest (beta={float(self.beta):g}); it predicts with the smoothed LP on "
                           f"{int(self.energy.pairwise_weights().ne(0).sum())} edges. Raise trainer.max_epochs or "
                           f"model.beta.")
        super().on_train_end()

    def solver_report(self) -> dict[str, Any]:
        report: dict[str, Any] = {"solver": "cccp", "outer_iterations": self.outer_iterations,
                                  "beta": float(self.beta), "converged": self.done}
        if torch.isfinite(self.last_objective).all():
            report["objective"] = self.last_objective.tolist()
        report["best_restart"] = int(self.best)
        return report

    def _solver_checkpoint(self) -> dict[str, Any] | None:
        return {"kind": "cccp", "outer_iterations": self.outer_iterations, "done": self.done}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("structtorch", {}).get("solver") or {}
        self.outer_iterations, self.done = state.get("outer_iterations", 0), state.get("done", False)

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
        self.full_certificate: dict[str, Any] | None = None

    def on_fit_start(self) -> None:
        if self.outer_iterations == 0:  # a fresh run (a resumed one has its weights): train Full first
            hp = self.hparams
            x, y = _training_tensors(self.trainer)
            with torch.no_grad():
                for p in self.restart_energy.parameters():
                    p.zero_()
            full = SmoothedLBFGS(self.restart_energy, x.to(self.device), y.to(self.device), self.l2_grid[0],
                                 smoothed_max=self.smoothed_max(), margin_scale=hp.margin_scale,
                                 bias_reg=hp.bias_reg, tol=hp.tol)
            info = full.fit()
            self.full_certificate = {"relative_gap": info.relative_gap.tolist(), "converged": info.converged.tolist()}
        super().on_fit_start()

    def solver_report(self) -> dict[str, Any]:
        return {**super().solver_report(), "full": self.full_certificate}
