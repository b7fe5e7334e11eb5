"""Energies: nn.Modules mapping inputs to Potentials (one base: ``energies/base.py``)."""

from .base import Energy
from .ensemble import TreeEnsembleEnergy
from .functions import FUNCTIONS, ConstantFunction, LinearFunction, LocalFunction, ZeroFunction, make_function
from .grid import GridEnergy
from .linear import FinleyJoachimsEnergy, LinearTableEnergy
from .local import LocalLinearEnergy

__all__ = ["FUNCTIONS", "ConstantFunction", "Energy", "FinleyJoachimsEnergy", "GridEnergy", "LinearFunction",
           "LinearTableEnergy", "LocalFunction", "LocalLinearEnergy", "TreeEnsembleEnergy", "ZeroFunction",
           "make_function"]
