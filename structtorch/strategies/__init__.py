"""Training strategies: how a learner's parameters are fitted, behind one protocol (``Strategy``) that
``StructuredLearner`` drives: gradient steps, certified L-BFGS, BCFW and DCD, CCCP (CRANK, Project) and Domke's
Algorithm 1 (LogisticEnergy)."""

from .base import StepCounter, Strategy
from .cccp import CCCP
from .certified import BCFWStrategy, Certified, DCDStrategy, LBFGSStrategy
from .domke import Algorithm1
from .gradient import OPTIMIZERS, Gradient
from .registry import SOLVERS, solver_strategy

__all__ = ["CCCP", "OPTIMIZERS", "Algorithm1", "BCFWStrategy", "Certified", "DCDStrategy", "Gradient",
           "LBFGSStrategy", "SOLVERS", "StepCounter", "Strategy", "solver_strategy"]
