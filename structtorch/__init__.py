"""structtorch: structured prediction on GPU (tree models, spanning-tree ensembles, smoothed LP)."""

from . import inference
from .graph import Graph
from .potentials import Potentials

__all__ = ["Graph", "Potentials", "inference"]
__version__ = "0.1.0"
