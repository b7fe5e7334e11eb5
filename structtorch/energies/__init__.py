"""Energies: nn.Modules mapping inputs to Potentials (one base: ``energies/base.py``)."""

from .base import Energy
from .ensemble import FEATURE_MAPS, TreeEnsembleEnergy
from .functions import ConstantFunction, LinearFunction, LocalFunction, ZeroFunction
from .grid import GridEnergy
from .linear import FinleyJoachimsEnergy, LinearTableEnergy
from .local import LocalLinearEnergy
from .registry import FUNCTIONS, make_function

__all__ = ["FEATURE_MAPS", "FUNCTIONS", "ConstantFunction", "Energy", "FinleyJoachimsEnergy", "GridEnergy",
           "LinearFunction", "LinearTableEnergy", "LocalFunction", "LocalLinearEnergy", "TreeEnsembleEnergy",
           "ZeroFunction", "make_function"]
