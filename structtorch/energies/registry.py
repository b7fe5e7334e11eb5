"""The local function classes by config name (``model.unary=``, ``model.pairwise=``): ``FUNCTIONS`` and
``make_function``, which builds one (classes in ``energies/functions.py``, ``mlp.py``, ``boost.py``)."""

from __future__ import annotations

from .boost import BoostedTrees
from .functions import ConstantFunction, LinearFunction, LocalFunction, ZeroFunction
from .mlp import MLPFunction

__all__ = ["FUNCTIONS", "make_function"]


def make_function(name: str, in_features: int, out_features: int, *, fit_iters: int = 50, hidden: int = 20,
                  lr: float = 0.25, epochs: int = 1, seed: int = 0) -> LocalFunction:
    """The function class ``name`` (a key of ``FUNCTIONS``) for D inputs and C states.

    fit_iters: L-BFGS iterations per fit (const, linear); hidden / lr / epochs / seed: the MLP's hidden
    units, SGD step, passes over the rows per fit and initialisation seed (seed is also xgboost's; boosting
    adds one tree per state per fit, as in the paper). ImportError for "boost" without xgboost.
    """
    if name == "zero":
        return ZeroFunction(in_features, out_features)
    if name == "const":
        return ConstantFunction(in_features, out_features, fit_iters=fit_iters)
    if name == "linear":
        return LinearFunction(in_features, out_features, fit_iters=fit_iters)
    if name == "mlp":
        return MLPFunction(in_features, out_features, hidden=hidden, lr=lr, epochs=epochs, seed=seed)
    if name == "boost":
        return BoostedTrees(in_features, out_features, seed=seed)
    raise ValueError(f"function class must be one of {list(FUNCTIONS)}, got {name!r}")


#: the function classes by config name, in the order of Domke's Table 1
FUNCTIONS = ("zero", "const", "linear", "boost", "mlp")
