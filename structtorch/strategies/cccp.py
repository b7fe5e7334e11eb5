"""CCCP for circuit-rank regularised max-margin learning: Algorithm 1 of Meshi, Eban, Elidan, Globerson (UAI 2013).

The objective l(w) + beta f(|w_pair|), with l the l2-regularised structured hinge (the smoothed LP relaxation of
its loss-augmented max at temperature ``eps``) and f the circuit-rank surrogate (eq. 12)
f = ||w_pair||_1 - max_T sum_{e in T} |w_e|, is a difference of convex functions. Each CCCP iteration:

1. linearises the concave part at w_t: v = sign(w_t) on the maximum spanning tree of |w_t|, 0 elsewhere
   (Prop. 4.3, ``cccp_linearization``);
2. minimises the convex h_t(w) = l(w) + beta ||w_pair||_1 - beta v^T w_pair by FISTA (its soft-threshold step sets
   edge weights exactly to zero);
3. grows beta by ``beta_growth`` whenever h stops decreasing while some support still has cycles, and stops once
   every support is a forest.

The learner's ``restarts`` starting points are one batched model; after each iteration the one with the lowest
objective among those whose support is a forest predicts, restricted to that forest (exact ``tree_map``). Project
(Sec. 6) is the same algorithm started from Full's certified weights with a large beta.

CCCP searches within half of the time budget, on the rows the learner's ``search_subset`` gives (all of them on a
small training set). When it ends, its forest (the maximum spanning forest of |w_pair| over the best restart's
support while that has cycles) is retrained on every row with exact tree inference to its certificate (the learner's
``refit_forest``), in the same epoch, so the checkpoint holds it. The smoothed LP at a fixed temperature is what
makes the search's loss differentiable, and it biases the weights: its entropy term, counted on every edge, grows
with the graph (at CRANK's default eps = 0.005 on 10 labels of medical-shaped data the search's weights had an
exact hinge objective 23% above Full's optimum and predicted 5 points of subset accuracy below it). The retrained
forest's weights minimise the hinge itself on their forest, and their gap certifies it.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import torch

from ..optim import Objective
from ..progress import out_of_time, share_deadline, until
from ..solvers import BatchedFISTA, LPSmoothedMax, SmoothedHinge, SmoothedLBFGS
from ..structure import cccp_linearization, circuit_rank, circuit_rank_penalty, max_spanning_tree
from .base import Strategy

__all__ = ["CCCP"]


class CCCP(Strategy):
    """Algorithm 1 on the learner's ``restart_energy`` ([R] Finley-Joachims models on the complete graph), with
    its ``beta``, ``best`` and ``last_objective`` buffers (checkpointed) and hyper-parameters beta_growth, cccp_tol,
    inner_iters, eps, predict_iters, lp_tol; after each iteration the learner's ``use_restart(b, forest)`` makes
    restart b its predictor. One Lightning epoch = one CCCP iteration.

    Args:
        from_full: start from Full's weights, trained to their certificate on the complete graph (Project).
        search_share: the share of the time budget left at the start that a search on a row subset may take.
    """

    name = "cccp"

    def __init__(self, learner, from_full: bool = False, search_share: float = 0.5) -> None:
        super().__init__(learner)
        self.from_full, self.search_share = from_full, search_share
        self.outer_iterations, self.done = 0, False
        self.full_certificate: dict[str, Any] | None = None
        self.refit: dict[str, Any] | None = None  # the certificate of the forest retrained on every row
        self.all_rows: tuple[torch.Tensor, torch.Tensor] | None = None  # (x, y): the rows the forest is retrained on
        self.search_deadline: float | None = None
        self.independent: tuple[torch.Tensor, ...] | None = None  # Independent's solution on every row, once known

    def check(self) -> None:
        if self.learner.hparams.solver != "auto":
            raise ValueError(f"{type(self.learner).__name__} trains by CCCP with FISTA inner solves; model.solver "
                             f"must be auto, got {self.learner.hparams.solver!r}")

    def setup(self, x: torch.Tensor, y: torch.Tensor, state: dict[str, Any] | None = None) -> None:
        learner, hp = self.learner, self.learner.hparams
        self.energy = learner.restart_energy.to(learner.device)
        self.outer_iterations, self.done = (state["outer_iterations"], state["done"]) if state else (0, False)
        self.refit = state.get("refit") if state and self.done else None  # cut short (max_epochs, time): search on
        self.all_rows, self.search_deadline = (x, y), share_deadline(self.search_share)
        x, y = (t.to(learner.device) for t in learner.search_subset(x, y))
        if state is None:  # a fresh run: Project from Full's optimum, CRANK's restart 0 from Independent's
            with until(self.search_deadline):
                if self.from_full:
                    self.full_certificate = self.train_full(x, y)
                else:
                    start = self.start_at_independent(x, y, slice(0, 1))
                    self.independent = start if len(x) == len(self.all_rows[0]) else None  # also the refit's
        self.loss = SmoothedHinge(self.energy, x, y, learner.l2_grid[0],  # l(w) [R]
                                  smoothed_max=LPSmoothedMax(hp.predict_iters, tol=hp.lp_tol), eps=hp.eps,
                                  margin_scale=hp.margin_scale, bias_reg=self.learner.bias_reg)
        self.v = torch.zeros_like(self.energy.edge_weight)
        self.fista = BatchedFISTA(self.loss.params, self.smooth_part, self.l1_weights())

    def start_at_independent(self, x: torch.Tensor, y: torch.Tensor, restarts: slice
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Independent's solution on x [N, D], y [N, n] (``independent_solution``, couplings 0) into ``restarts``
        of the energy; returns it (weights [1, n, D], biases [1, n], objective [1]), or None where the learner has
        no such start."""
        start = self.learner.independent_solution(x, y, self.learner.l2_grid[0], None)
        if start is None:
            return None
        w, b, _ = start
        energy = self.energy
        with torch.no_grad():
            energy.unary.weight[restarts] = w.to(energy.unary.weight)
            energy.unary.bias[restarts] = b.to(energy.unary.bias)
            energy.edge_weight[restarts] = 0.0
        return start

    def refit_start(self, b: int, objective: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where the forest's refit on every row starts (couplings 0): Independent's solution on every row (the one
        restart 0 started at when the search had every row), else, where the learner has no such start, restart
        b's unary weights, whose CCCP objective is ``objective``. Returns weights [n, D], biases [n], objective
        [1] (about). (From the search's own weights, biased by its smoothing, the refit on medical-shaped data was
        not certified in 10,000 iterations.)"""
        x, y = self.all_rows
        start = self.independent if self.independent is not None else self.learner.independent_solution(
            x, y, self.learner.l2_grid[0], None)
        if start is not None:
            return start[0][0], start[1][0], start[2]
        return self.energy.unary.weight[b].detach(), self.energy.unary.bias[b].detach(), objective.reshape(1)

    def train_full(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        """Full's certified optimum on the complete graph into every restart (Project's start), from Independent's
        solution (as ``Full`` starts) or from 0."""
        hp = self.learner.hparams
        with torch.no_grad():
            for p in self.energy.parameters():
                p.zero_()
        start = self.start_at_independent(x, y, slice(None))
        full = SmoothedLBFGS(self.energy, x, y, self.learner.l2_grid[0], smoothed_max=self.learner.smoothed_max(),
                             margin_scale=hp.margin_scale, bias_reg=self.learner.bias_reg, tol=hp.tol)
        if start is not None:
            full.start_near_optimum(start[2].expand(hp.restarts))
        info = full.fit()
        return {"relative_gap": info.relative_gap.tolist(), "converged": info.converged.tolist()}

    # ------------------------------------------------------------------ h_t = l + beta |w_pair|_1 - beta v^T w_pair
    def l1_weights(self) -> list[torch.Tensor | None]:
        """beta on the edge weights, no l1 term on the other parameters."""
        beta = self.learner.beta.expand(self.learner.hparams.restarts)
        return [beta if p is self.energy.edge_weight else None for p in self.loss.params]

    def smooth_part(self) -> Objective:
        """The smooth part of h_t [R], l(w) - beta v^T w_pair: one tensor, or terms where l is streamed over chunks
        of rows."""
        loss, linear = self.loss.objective(), self.learner.beta * (self.v * self.energy.edge_weight).sum(1)
        return loss - linear if isinstance(loss, torch.Tensor) else chain(loss, [-linear])

    def objective(self) -> torch.Tensor:
        """l(w) + beta f(|w_pair|) [R] (what CCCP decreases) at FISTA's iterate, no gradient: l is recovered from
        FISTA's h_t = l - beta v^T w + beta |w|_1 without another smoothed-LP evaluation."""
        w, beta = self.energy.edge_weight.detach(), self.learner.beta
        loss = self.fista.F - beta * (w.abs().sum(1) - (self.v * w).sum(1))
        return loss + beta * circuit_rank_penalty(w.abs(), self.energy.graph)

    # ------------------------------------------------------------------ Algorithm 1
    def iteration(self) -> dict[str, float]:
        """One CCCP iteration on every restart, then the beta schedule; logs and returns its statistics."""
        learner, hp, graph = self.learner, self.learner.hparams, self.energy.graph
        self.v = cccp_linearization(self.energy.edge_weight.detach(), graph)  # step 1, Prop. 4.3
        self.fista.set_l1(self.l1_weights())
        steps = self.fista.iterations
        with until(self.search_deadline):
            self.fista.run(hp.inner_iters)  # step 2: minimise h_t
            searched = out_of_time()
        moved = self.fista.iterations > steps  # none: the budget was spent before this iteration's first step
        h = self.objective()
        support = self.energy.edge_weight.detach() != 0
        rank = circuit_rank(support, graph)
        forest = rank == 0
        stalled = (learner.last_objective - h) <= hp.cccp_tol * h.abs()
        learner.last_objective = h.clone()
        self.outer_iterations += 1
        if moved and bool(stalled.all()):  # step 3
            if bool(forest.all()):
                self.done = True
            else:
                learner.beta *= hp.beta_growth
                learner.last_objective.fill_(float("inf"))
        b = int((torch.where(forest, h, float("inf")) if bool(forest.any()) else h).argmin())  # forests first
        learner.best.fill_(b)
        tree = support[b] if bool(forest[b]) else None
        ended = "stationary" if self.done else "time share" if searched else "max_epochs" if self.last_epoch() else ""
        if ended:  # the search's forest, retrained on every row with exact inference to its certificate, predicts
            if tree is None:
                tree = max_spanning_tree(self.energy.edge_weight[b].detach().abs(), graph) & support[b]
            self.refit = learner.refit_forest(*self.all_rows, tree.cpu(), self.refit_start(b, h[b])) | {
                "after": ended}
        else:
            learner.use_restart(b, tree)
        stats = {"train/objective": float(h[b]), "train/beta": float(learner.beta),
                 "train/circuit_rank": float(rank[b]), "train/nonzero_edges": float(support[b].sum()),
                 "train/forests": float(forest.sum())}
        learner.log_dict(stats, prog_bar=True, on_step=False, on_epoch=True)
        return stats

    def last_epoch(self) -> bool:
        """Whether this is the run's last epoch (``trainer.max_epochs``)."""
        trainer = self.learner.trainer
        return trainer.max_epochs is not None and 0 <= trainer.max_epochs <= self.learner.current_epoch + 1

    # ------------------------------------------------------------------ the protocol
    def training_step(self, batch: tuple, batch_idx: int) -> None:
        if batch_idx != 0 or self.done or self.refit is not None:
            return None
        self.iteration()
        self.step_counter()
        return None

    def epoch_end(self) -> bool:
        return self.done or self.refit is not None

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.name, "outer_iterations": self.outer_iterations, "done": self.done, "refit": self.refit}

    def report(self) -> dict[str, Any]:
        learner = self.learner
        report: dict[str, Any] = {"solver": self.name, "outer_iterations": self.outer_iterations,
                                  "beta": float(learner.beta), "converged": self.done}
        if torch.isfinite(learner.last_objective).all():
            report["objective"] = learner.last_objective.tolist()
        report["best_restart"] = int(learner.best)
        report |= {"refit": self.refit} if self.refit is not None else {}
        return report | ({"full": self.full_certificate} if self.from_full else {})

    def warning(self) -> str | None:
        learner = self.learner
        if self.refit is not None:
            return None
        # stopped by a limit other than the search's own (max_steps, max_time, an interrupt)
        cycles = "" if learner.graph.is_forest else (
            f"; it predicts with the smoothed LP on {int(learner.energy.pairwise_weights().ne(0).sum())} edges "
            f"(beta={float(learner.beta):g})")
        return (f"{type(learner).__name__} stopped before its search on {len(self.loss.y)} of the "
                f"{len(self.all_rows[1])} training rows ended: its forest was not retrained to its certificate"
                f"{cycles}")
