"""Full-batch L-BFGS (strong Wolfe line search) for smooth convex objectives, e.g. CRF NLL + l2."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["LBFGSInfo", "lbfgs_solve"]


@dataclass
class LBFGSInfo:
    """Result of ``lbfgs_solve`` (M = number of models; 1 without a model dim).

    objective: [M] final objective per model; grad_norm: [M] final gradient norm; initial_grad_norm: [M];
    converged: [M] bool, grad_norm <= tol * initial_grad_norm; iterations: L-BFGS iterations run.
    """

    objective: torch.Tensor
    grad_norm: torch.Tensor
    initial_grad_norm: torch.Tensor
    converged: torch.Tensor
    iterations: int


def lbfgs_solve(objective: Callable[[], torch.Tensor], params: list[torch.Tensor], tol: float = 1e-6,
                max_iter: int = 500, num_models: int | None = None, history_size: int = 20,
                check_every: int = 10) -> LBFGSInfo:
    """Minimise ``objective()`` over ``params`` in place with torch.optim.LBFGS (strong Wolfe).

    objective: closure recomputing the objective from ``params``: a scalar, or [M] per-model values of
        a separable objective (their sum is minimised).
    params: leaf tensors requiring grad; with ``num_models=M`` each has a leading [M] dim and model m
        owns slice m, so the stopping rule is checked per model.
    tol: stop when every model's gradient norm is <= tol times its initial gradient norm.
    max_iter: cap on L-BFGS iterations (checked every ``check_every`` iterations).
    """
    if not params or any(not (isinstance(p, torch.Tensor) and p.requires_grad and p.is_leaf) for p in params):
        raise TypeError("params must be a non-empty list of leaf tensors with requires_grad=True")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive int, got {max_iter!r}")
    if num_models is not None and any(p.dim() == 0 or p.shape[0] != num_models for p in params):
        raise ValueError(f"with num_models={num_models} every parameter needs a leading [M={num_models}] dim, "
                         f"got shapes {[tuple(p.shape) for p in params]}")

    def per_model() -> tuple[torch.Tensor, torch.Tensor]:
        value = objective()
        grads = torch.autograd.grad(value.sum(), params, allow_unused=True)
        sq = sum((g.pow(2).sum() if num_models is None else g.pow(2).flatten(1).sum(1))
                 for g in grads if g is not None)
        vals = value.detach().reshape(-1) if num_models is None else value.detach().expand(num_models)
        return vals, torch.as_tensor(sq).sqrt().reshape(-1)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        value = objective().sum()
        value.backward()
        return value

    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=check_every, history_size=history_size,
                            tolerance_grad=0.0, tolerance_change=0.0, line_search_fn="strong_wolfe")
    _, g0 = per_model()
    done, vals, gn = 0, None, g0
    while done < max_iter:
        opt.step(closure)
        done = opt.state[opt._params[0]]["n_iter"]
        vals, gn = per_model()
        if bool((gn <= tol * g0).all()) or not bool(torch.isfinite(gn).all()):
            break
    if vals is None:
        vals, gn = per_model()
    return LBFGSInfo(objective=vals, grad_norm=gn, initial_grad_norm=g0, converged=gn <= tol * g0,
                     iterations=int(done))
