"""Local function classes for grid energies: f(features) -> one score per factor state, fitted by a
*biased* logistic regression (Domke 2013, eq. 11 / 13): minimise over the function g

    mean_m  CE( softmax(g(phi_m) + b_m), t_m )  =  mean_m [ lse(g(phi_m) + b_m) - g(phi_m)_{t_m} - b_m(t_m) ]

for rows m (every position of every example of one factor type), features phi [M, D], per-row biases
b [M, C] and targets t [M]. Here: the base ``LocalFunction``, the helpers every class shares
(``biased_logistic_loss``, ``check_fit_args``) and the classes zero, const, linear (L-BFGS: ``optim.minimize``);
mlp is in ``energies/mlp.py`` (SGD), boost in ``energies/boost.py`` (gradient-boosted regression trees by
xgboost, an optional extra), the registry of config names in ``energies/registry.py``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..graph import check_int
from ..optim import minimize

__all__ = ["ConstantFunction", "LinearFunction", "LocalFunction", "ZeroFunction", "biased_logistic_loss",
           "check_fit_args"]


def biased_logistic_loss(scores: torch.Tensor, bias: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean biased logistic loss (the negated objective of eq. 11): scores, bias [M, C], target [M] -> []."""
    return F.cross_entropy(scores + bias, target)


def check_fit_args(fn: LocalFunction, x: torch.Tensor, bias: torch.Tensor, target: torch.Tensor) -> None:
    """ValueError unless ``fn.fit``'s arguments are features x [M, D], bias [M, C] and a long target [M]."""
    M = x.shape[0]
    if x.dim() != 2 or x.shape[1] != fn.in_features:
        raise ValueError(f"{type(fn).__name__}.fit: features must be [M, D={fn.in_features}], got {tuple(x.shape)}")
    if bias.shape != (M, fn.out_features):
        raise ValueError(f"{type(fn).__name__}.fit: bias must be [M={M}, C={fn.out_features}], got {tuple(bias.shape)}")
    if target.shape != (M,) or target.dtype != torch.long:
        raise ValueError(f"{type(fn).__name__}.fit: target must be a long tensor [M={M}], got {target.dtype} "
                         f"{tuple(target.shape)}")


class LocalFunction(nn.Module):
    """Base: ``forward(phi [..., D]) -> scores [..., C]`` and ``fit(phi, bias, target, generator)``.

    ``fit`` lowers the biased logistic loss from the current function (a warm start: every learning
    iteration continues from the previous function) and returns the loss after fitting.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)

    def fit(self, x: torch.Tensor, bias: torch.Tensor, target: torch.Tensor,
            generator: torch.Generator | None = None) -> float:
        raise NotImplementedError

    def _loss(self, x: torch.Tensor, bias: torch.Tensor, target: torch.Tensor) -> float:
        with torch.no_grad():
            return float(biased_logistic_loss(self(x), bias, target))


class ZeroFunction(LocalFunction):
    """f = 0 (nothing to fit)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(*x.shape[:-1], self.out_features)

    def fit(self, x, bias, target, generator=None) -> float:
        check_fit_args(self, x, bias, target)
        return self._loss(x, bias, target)


class _LBFGSFunction(LocalFunction):
    """A function whose parameters are fitted by full-batch L-BFGS (``optim.minimize``), ``fit_iters`` iterations."""

    def __init__(self, in_features: int, out_features: int, fit_iters: int = 50) -> None:
        super().__init__(in_features, out_features)
        self.fit_iters = check_int(fit_iters, "fit_iters", 1)

    def fit(self, x, bias, target, generator=None) -> float:
        check_fit_args(self, x, bias, target)
        x, bias = x.to(self.dtype), bias.to(self.dtype)
        minimize(list(self.parameters()), lambda: biased_logistic_loss(self(x), bias, target), self.fit_iters)
        return self._loss(x, bias, target)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype


class ConstantFunction(_LBFGSFunction):
    """f(phi) = c, one score per state ignoring the input (a linear function of a constant feature)."""

    def __init__(self, in_features: int, out_features: int, fit_iters: int = 50) -> None:
        super().__init__(in_features, out_features, fit_iters)
        self.c = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c.to(x.dtype).expand(*x.shape[:-1], self.out_features)


class LinearFunction(_LBFGSFunction):
    """f(phi) = W phi (no offset: the features carry a constant, as in Domke's experiments); W [C, D] from 0."""

    def __init__(self, in_features: int, out_features: int, fit_iters: int = 50) -> None:
        super().__init__(in_features, out_features, fit_iters)
        self.weight = nn.Parameter(torch.zeros(out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.to(x.dtype).T
