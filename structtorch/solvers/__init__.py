"""Convex solvers with certificates: BCFW for structured SVMs, L-BFGS for smooth objectives."""

from .bcfw import BCFW, GapInfo, Oracle, StepInfo, one_hot_marginals, smoothed_oracle, tree_oracle
from .lbfgs import LBFGSInfo, lbfgs_solve

__all__ = ["BCFW", "GapInfo", "LBFGSInfo", "Oracle", "StepInfo", "lbfgs_solve", "one_hot_marginals",
           "smoothed_oracle", "tree_oracle"]
