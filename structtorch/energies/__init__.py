"""Energies: nn.Modules mapping inputs to Potentials."""

from .linear import Energy, FinleyJoachimsEnergy, LinearTableEnergy

__all__ = ["Energy", "FinleyJoachimsEnergy", "LinearTableEnergy"]
