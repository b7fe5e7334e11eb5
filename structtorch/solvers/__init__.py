"""Convex solvers with certificates: BCFW and smoothed L-BFGS for structured SVMs, L-BFGS for smooth objectives."""

from .bcfw import BCFW, GapInfo, Oracle, StepInfo, one_hot_marginals, smoothed_oracle, tree_oracle
from .lbfgs import LBFGSInfo, lbfgs_solve
from .smoothing import SmoothedLBFGS, SmoothedMax, lp_smoothed_max, tree_smoothed_max

__all__ = ["BCFW", "GapInfo", "LBFGSInfo", "Oracle", "SmoothedLBFGS", "SmoothedMax", "StepInfo", "lbfgs_solve",
           "lp_smoothed_max", "one_hot_marginals", "smoothed_oracle", "tree_oracle", "tree_smoothed_max"]
