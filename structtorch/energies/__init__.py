"""Energies: nn.Modules mapping inputs to Potentials (one base: ``energies/base.py``)."""

from .base import Energy
from .ensemble import TreeEnsembleEnergy
from .linear import FinleyJoachimsEnergy, LinearTableEnergy
from .local import LocalLinearEnergy

__all__ = ["Energy", "FinleyJoachimsEnergy", "LinearTableEnergy", "LocalLinearEnergy", "TreeEnsembleEnergy"]
