"""Accelerated proximal gradient (FISTA) for M independent l1-regularised problems at once.

Minimises F_m(w) = f_m(w) + sum_k c_mk |w_k| for every model m, with f smooth (its gradient from
autograd) and c >= 0 a per-coordinate l1 weight (Beck & Teboulle 2009). The l1 step is the
soft-threshold, so coordinates with a small enough gradient are *exactly* zero: what a structure
regulariser on edge weights needs (CRANK's beta |w_pair|_1). Each model keeps its own step size
(backtracking on the quadratic upper bound, then a 0.9 growth factor per iteration) and its own
momentum, restarted whenever F increases (O'Donoghue & Candes 2015), so the iterates are monotone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..optim import ModelSlices, Objective
from ..progress import tick

__all__ = ["BatchedFISTA"]


class BatchedFISTA:
    """FISTA on M problems whose model m owns slice m of every parameter (leading [M] dim).

    Args:
        params: leaf tensors [M, ...], updated in place.
        smooth: closure returning f [M] at the current ``params`` (differentiable; or streamed terms, ``Objective``).
        l1: one entry per parameter: None (no l1 term) or the weights c [M] (same for the whole
            parameter block) or c [M, ...] (per coordinate, the parameter's shape).
    """

    def __init__(self, params: list[torch.Tensor], smooth: Callable[[], Objective],
                 l1: list[torch.Tensor | None]) -> None:
        if len(l1) != len(params):
            raise ValueError(f"l1 needs one entry per parameter ({len(params)}), got {len(l1)}")
        self.params, self.smooth = params, smooth
        self.slices = ModelSlices(params, params[0].shape[0])
        self.M, self.sizes = self.slices.M, self.slices.sizes
        self.set_l1(l1)
        ref = params[0]
        self.step_inv = torch.ones(self.M, dtype=ref.dtype, device=ref.device)  # L, the inverse step size
        self.iterations = 0
        self.restart()

    def set_l1(self, l1: list[torch.Tensor | None]) -> None:
        """New l1 weights (same layout as the constructor's); the momentum restarts."""
        blocks = []
        for p, c, n in zip(self.params, l1, self.sizes):
            if c is None:
                blocks.append(p.new_zeros(self.M, n))
            else:
                c = torch.as_tensor(c, dtype=p.dtype, device=p.device)
                c = c.reshape(self.M, 1).expand(self.M, n) if c.dim() == 1 else c.reshape(self.M, n)
                if not bool((c >= 0).all()):
                    raise ValueError("l1 weights must be >= 0")
                blocks.append(c)
        self.c = torch.cat(blocks, 1)
        if hasattr(self, "x"):
            self.restart()

    def _evaluate(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(f [M], grad f [M, P]) at the flat point X."""
        self.slices.set(X)
        return self.slices.value_and_grad(self.smooth)

    def objective(self, X: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """F = f + sum c |w| [M] at X with smooth part f."""
        return f + (self.c * X.abs()).sum(1)

    def restart(self) -> None:
        """Drop the momentum and re-evaluate at the current parameters (after f or c changed)."""
        self.x = self.slices.flat()
        self.t = torch.ones_like(self.step_inv)
        self.fy, self.gy = self._evaluate(self.x)
        self.y = self.x
        self.F = self.objective(self.x, self.fy)

    # ------------------------------------------------------------------ iterations
    def _prox(self, Z: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
        """Soft-threshold: argmin_w L/2 |w - Z|^2 + c |w|."""
        return torch.sign(Z) * (Z.abs() - self.c / L[:, None]).clamp_min(0.0)

    def step(self, active: torch.Tensor | None = None, max_backtracks: int = 40) -> torch.Tensor:
        """One FISTA iteration for the models where ``active`` [M] (others stay put). Returns the
        prox-gradient mapping norm L |x_new - y| [M] (0 at a minimiser)."""
        active = torch.ones(self.M, dtype=torch.bool, device=self.c.device) if active is None else active
        L = self.step_inv
        accepted = ~active
        x_new, f_new = self.x.clone(), self.F.new_zeros(self.M)
        for _ in range(max_backtracks):
            trial = torch.where(accepted[:, None], x_new, self._prox(self.y - self.gy / L[:, None], L))
            self.slices.set(trial)
            f = self.slices.value(self.smooth)  # the trial's gradient is not needed: the accepted y's is
            d = trial - self.y
            bound = self.fy + (self.gy * d).sum(1) + 0.5 * L * (d * d).sum(1)
            ok = accepted | (f <= bound + 1e-12 * self.fy.abs())
            x_new = torch.where(ok[:, None] & ~accepted[:, None], trial, x_new)
            f_new = torch.where(ok & ~accepted, f, f_new)
            accepted = ok
            if bool(ok.all()):
                break
            L = torch.where(ok, L, 2.0 * L)
        x_new = torch.where(active[:, None] & accepted[:, None], x_new, self.x)
        moved = active & accepted
        F_new = torch.where(moved, self.objective(x_new, f_new), self.F)
        residual = torch.where(moved, L * (x_new - self.y).norm(dim=1), torch.zeros_like(L))
        worse = moved & (F_new > self.F)  # adaptive restart: discard the step, restart momentum from x
        x_new = torch.where(worse[:, None], self.x, x_new)
        F_new = torch.where(worse, self.F, F_new)
        t_next = 0.5 * (1.0 + torch.sqrt(1.0 + 4.0 * self.t * self.t))
        momentum = torch.where(moved & ~worse, (self.t - 1.0) / t_next, torch.zeros_like(t_next))
        self.y = x_new + momentum[:, None] * (x_new - self.x)
        self.x, self.F = x_new, F_new
        self.t = torch.where(worse, torch.ones_like(self.t), torch.where(moved, t_next, self.t))
        self.step_inv = torch.where(moved & ~worse, 0.9 * L, L)
        self.fy, self.gy = self._evaluate(self.y)
        self.iterations += 1
        self.slices.set(self.x)
        return residual

    def run(self, iterations: int, rel_tol: float = 1e-6, patience: int = 5) -> torch.Tensor:
        """Up to ``iterations`` steps (fewer once the run's time budget is spent); a model stops once its F decreased
        by less than rel_tol |F| in ``patience`` consecutive iterations. Returns F [M] at the final iterate
        (left in ``params``)."""
        active = torch.ones(self.M, dtype=torch.bool, device=self.c.device)
        calm = torch.zeros(self.M, dtype=torch.long, device=self.c.device)
        for i in range(iterations):
            if not tick(i, iterations, "FISTA iterations"):
                break
            before = self.F.clone()
            self.step(active)
            small = (before - self.F) <= rel_tol * self.F.abs().clamp_min(math.ulp(1.0))
            calm = torch.where(small, calm + 1, torch.zeros_like(calm))
            active &= calm < patience
            if not bool(active.any()):
                break
        self.slices.set(self.x)
        return self.F
