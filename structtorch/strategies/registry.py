"""The strategies a user picks by name (``model.solver``)."""

from __future__ import annotations

from .base import Strategy
from .certified import BCFWStrategy, DCDStrategy, LBFGSStrategy
from .gradient import OPTIMIZERS, Gradient

__all__ = ["SOLVERS", "solver_strategy"]

#: model.solver values: "auto" (the learner picks), the certified solvers of linear energies, the gradient optimizers
SOLVERS = ("auto", "lbfgs", "bcfw", "dcd", *OPTIMIZERS)


def solver_strategy(learner, name: str) -> Strategy:
    """The strategy of a ``model.solver`` name other than "auto" (``SOLVERS``) for ``learner``."""
    if name in OPTIMIZERS:
        return Gradient(learner, name)
    return {"lbfgs": LBFGSStrategy, "bcfw": BCFWStrategy, "dcd": DCDStrategy}[name](learner)
