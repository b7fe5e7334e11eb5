"""Full-batch L-BFGS for smooth objectives (core: torch only), the package's one L-BFGS: ``BatchedLBFGS`` (M
separable problems, per-model memory and line search; the CRF and smoothed-hinge solvers, the conditionals of
tree-CRF structure learning, and through ``minimize`` the local functions of grid energies) and its per-model
backtracking line search ``backtrack`` (also Newton's, in ``estimation.conditionals``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch

from .graph import check_int
from .progress import OutOfTime, tick

__all__ = ["BatchedLBFGS", "ModelSlices", "Objective", "backtrack", "minimize"]

#: an objective's value [M]: one differentiable tensor, or (streamed) the terms that sum to it
Objective = torch.Tensor | Iterable[torch.Tensor]


def backtrack(evaluate: Callable[[torch.Tensor], tuple[torch.Tensor, ...]], f0: torch.Tensor, slope: torch.Tensor,
              t: torch.Tensor, max_backtracks: int = 30) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Backtracking (Armijo) line search of many models at once: each model halves its step t [*M] until
    f(t) <= f0 + 1e-4 t slope (f0, slope: the value and directional derivative at t = 0 [*M]; a zero step
    always passes), and gets t = 0 if ``max_backtracks`` tries find no such step. ``evaluate(t)`` returns
    (f [*M], anything else) at steps t [*M]. Returns the steps and ``evaluate`` at them."""
    for _ in range(max_backtracks):
        out = evaluate(t)
        ok = (out[0] <= f0 + 1e-4 * t * slope) | (t == 0)
        if bool(ok.all()):
            return t, out
        t = torch.where(ok, t, 0.5 * t)
        del out  # the failed trial's gradient goes before the next trial's is made
    t = torch.where(ok, t, 0.0)
    return t, evaluate(t)


class ModelSlices:
    """Parameters of M models (leading [M] dim on each; none when ``num_models`` is None, M = 1) viewed as
    one flat matrix [M, P]: model m's coordinates in row m."""

    def __init__(self, params: list[torch.Tensor], num_models: int | None) -> None:
        self.params = params
        self.M = 1 if num_models is None else num_models
        self.sizes = [p[0].numel() if num_models is not None else p.numel() for p in params]

    def flat(self) -> torch.Tensor:
        """The current values [M, P]."""
        return torch.cat([p.detach().reshape(self.M, -1) for p in self.params], 1)

    def set(self, X: torch.Tensor, which: torch.Tensor | None = None) -> None:
        """Write X [M, P] into the parameters of the models where ``which`` [M] (default all)."""
        with torch.no_grad():
            for p, chunk in zip(self.params, X.split(self.sizes, 1)):
                if which is None:
                    p.copy_(chunk.reshape(p.shape))
                else:
                    rows = p.view(self.M, -1)
                    rows[which] = chunk[which]

    def set_along(self, X: torch.Tensor, t: torch.Tensor, d: torch.Tensor) -> None:
        """Write X + t d (X, d [M, P], t [M]) into the parameters in place (no [M, P] temporary)."""
        with torch.no_grad():
            for p, x, dd in zip(self.params, X.split(self.sizes, 1), d.split(self.sizes, 1)):
                p.view(self.M, -1).copy_(x).addcmul_(t[:, None], dd)

    def read(self, X: torch.Tensor, which: torch.Tensor) -> None:
        """Copy the current values of the models where ``which`` [M] into their rows of X [M, P] in place."""
        with torch.no_grad():
            for p, chunk in zip(self.params, X.split(self.sizes, 1)):
                for m in which.nonzero()[:, 0].tolist():
                    chunk[m].copy_(p.detach().view(self.M, -1)[m])

    def value(self, objective: Callable[[], Objective]) -> torch.Tensor:
        """objective() [M] at the current parameters, without building its graph (a line search's trial points)."""
        with torch.no_grad():
            return sum(term.reshape(self.M) for term in _terms(objective()))

    def value_and_grad(self, objective: Callable[[], Objective]) -> tuple[torch.Tensor, torch.Tensor]:
        """(objective() [M], its gradient [M, P]) at the current parameters; a streamed objective (an iterable of
        terms [M]) is summed term by term, each term's graph freed before the next is built."""
        value, grad = 0, self.params[0].new_zeros(self.M, sum(self.sizes))  # before any term's gradients exist
        with torch.enable_grad():
            for term in _terms(objective()):
                term = term.reshape(self.M)
                grads = list(torch.autograd.grad(term.sum(), self.params, allow_unused=True))
                value = value + term.detach()
                for k, chunk in enumerate(grad.split(self.sizes, 1)):  # in place, each term's gradient freed
                    if grads[k] is not None:
                        chunk.add_(grads[k].reshape(self.M, -1))
                        grads[k] = None
        return value, grad


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise inner products [M] of a, b [M, P], without an [M, P] temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).reshape(len(a))


def _terms(objective: Objective) -> Iterator[torch.Tensor]:
    """The terms [M] of an objective's value: the value itself, or those a streamed objective yields."""
    return iter([objective]) if isinstance(objective, torch.Tensor) else iter(objective)


class BatchedLBFGS:
    """L-BFGS on M independent problems at once: ``objective()`` returns [M] values of a separable
    objective whose model m owns slice m of every parameter (leading [M] dim; no model dim for M = 1).
    Every model keeps its own curvature pairs and takes its own backtracking (Armijo) step along its
    own direction, so a regularisation grid converges as fast as its slowest member alone; one
    evaluation of the objective serves all models.

    Args:
        params: leaf tensors requiring grad, updated in place.
        objective: closure recomputing the [M] values from ``params`` (a tensor, or streamed terms: ``Objective``).
        num_models: M, or None (parameters without a model dim).
        history_size: curvature pairs kept per model.
    """

    def __init__(self, params: list[torch.Tensor], objective: Callable[[], Objective],
                 num_models: int | None = None, history_size: int = 20) -> None:
        if not params or any(not (isinstance(p, torch.Tensor) and p.requires_grad and p.is_leaf) for p in params):
            raise TypeError("params must be a non-empty list of leaf tensors with requires_grad=True")
        if num_models is not None and any(p.dim() == 0 or p.shape[0] != num_models for p in params):
            raise ValueError(f"with num_models={num_models} every parameter needs a leading [M={num_models}] dim, "
                             f"got shapes {[tuple(p.shape) for p in params]}")
        self.params, self.objective = params, objective
        self.history_size = check_int(history_size, "history_size", 1)
        self.M = 1 if num_models is None else num_models
        self.slices = ModelSlices(params, num_models)
        ref = params[0]
        self.S: list[torch.Tensor] = []  # [M, P] each
        self.Y: list[torch.Tensor] = []
        self.rho: list[torch.Tensor] = []  # [M]; 0 = no pair for that model
        self.gamma = torch.ones(self.M, dtype=ref.dtype, device=ref.device)  # initial Hessian scale
        self.fresh = torch.ones(self.M, dtype=torch.bool, device=ref.device)  # no curvature yet: short first step
        self.value, self.grad = self._evaluate()

    def _evaluate(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.slices.value_and_grad(self.objective)

    def reset(self, which: torch.Tensor) -> None:
        """Forget the curvature pairs of the models where ``which`` [M] (e.g. after their objective changed) and
        re-evaluate."""
        self.forget(which)
        self.refresh()

    def forget(self, which: torch.Tensor) -> None:
        """Forget the curvature pairs of the models where ``which`` [M]; ``refresh()`` before the next step."""
        for rho in self.rho:
            rho[which] = 0.0
        self.gamma[which] = 1.0
        self.fresh |= which

    def refresh(self, start: torch.Tensor | None = None) -> None:
        """Re-evaluate the objective and gradient at the current parameters (after the objective changed); with
        ``start`` [M, P], the parameters moved there from ``start`` outside the optimizer on the same objective (a
        block step), and that move becomes a curvature pair."""
        before = self.grad
        self.value, self.grad = self._evaluate()
        if start is not None:
            self._remember(self.slices.flat().sub_(start), self.grad - before, torch.ones_like(self.gamma))

    def _direction(self, g: torch.Tensor) -> torch.Tensor:
        """-H g by the two-loop recursion, per model, in place (no [M, P] temporaries: with millions of parameters,
        as MAM's, allocating them took half of an iteration)."""
        q, alphas = g.clone(), []
        for s, y, rho in zip(reversed(self.S), reversed(self.Y), reversed(self.rho)):
            a = rho * _dot(s, q)
            q.addcmul_(a[:, None], y, value=-1.0)
            alphas.append(a)
        r = q.mul_(self.gamma[:, None])
        for s, y, rho, a in zip(self.S, self.Y, self.rho, reversed(alphas)):
            r.addcmul_((a - rho * _dot(y, r))[:, None], s)
        return r.neg_()

    def step(self, active: torch.Tensor | None = None, max_backtracks: int = 30) -> torch.Tensor:
        """One iteration for the models where ``active`` [M] (default all); the others do not move.
        Returns bool [M]: the active models whose line search found no decrease (converged to rounding,
        or stalled): stepping them again is wasted work."""
        active = torch.ones(self.M, dtype=torch.bool, device=self.gamma.device) if active is None else active
        g, f0, X0 = self.grad, self.value, self.slices.flat()
        d = self._direction(g)
        slope = _dot(d, g)
        uphill = slope >= 0
        if bool(uphill.any()):
            d[uphill] = -g[uphill]
            slope = torch.where(uphill, -_dot(g, g), slope)
        l1 = torch.linalg.vector_norm(g, 1, dim=1)
        t = torch.where(self.fresh | uphill, (1.0 / l1.clamp_min(1e-300)).clamp(max=1.0), 1.0)
        t = torch.where(active & (slope < 0), t, 0.0)

        def at(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.slices.set_along(X0, t, d)
            return self._evaluate()

        try:
            t, (f, G) = backtrack(at, f0, slope, t, max_backtracks)
        except OutOfTime:  # a streamed evaluation stopped by the time budget: back to the step's start
            self.slices.set(X0)
            raise
        self._remember(d.mul_(t[:, None]), g.neg_().add_(G), t)  # in place: g is not used again
        self.value, self.grad = f, G
        return active & (t == 0)

    def _remember(self, s: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> None:
        """Keep the curvature pair (s, y) [M, P] of a step of length t [M] (0: none) where s^T y > 0; the oldest pair
        goes first (peak memory)."""
        if len(self.S) == self.history_size:
            del self.S[0], self.Y[0], self.rho[0]
        sy, yy = _dot(s, y), _dot(y, y)
        valid = (t > 0) & (sy > 1e-10 * yy)
        self.S.append(s)
        self.Y.append(y)
        self.rho.append(torch.where(valid, 1.0 / sy.clamp_min(1e-300), 0.0))
        self.gamma = torch.where(valid, sy / yy.clamp_min(1e-300), self.gamma)
        self.fresh &= ~valid

    def run(self, max_iter: int, gtol: float | torch.Tensor = 0.0, ftol: float | None = None) -> torch.Tensor:
        """Step every model until its gradient norm is <= ``gtol`` (a float or [M]), its line search stalls, its
        value changes by less than ``ftol`` in an iteration (None: no such rule), ``max_iter`` iterations, or the
        run's time budget is spent (``progress.time_budget``). Returns bool [M]: the models whose gradient norm
        is <= gtol."""
        active = self.grad.norm(dim=1) > gtol
        for i in range(max_iter):
            if not bool(active.any()):
                break
            if not tick(i, max_iter, "L-BFGS iterations"):
                break
            before = self.value
            active &= ~self.step(active) & (self.grad.norm(dim=1) > gtol)
            if ftol is not None:
                active &= (before - self.value).abs() >= ftol
        return self.grad.norm(dim=1) <= gtol


def minimize(params: list[torch.Tensor], loss: Callable[[], torch.Tensor], iters: int, gtol: float = 1e-9,
             ftol: float = 1e-12) -> None:
    """Minimise the scalar ``loss()`` over ``params`` (leaf tensors) in place: at most ``iters`` full-batch
    ``BatchedLBFGS`` iterations, fewer when the gradient norm reaches ``gtol``, the loss changes by less than
    ``ftol`` in an iteration (e.g. at float32's rounding) or the line search stalls."""
    BatchedLBFGS(params, loss).run(iters, gtol, ftol)
