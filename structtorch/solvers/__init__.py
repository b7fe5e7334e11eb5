"""Convex solvers: BCFW and smoothed L-BFGS (certified) for structured SVMs, dual coordinate descent (certified)
for one linear SVM per label, FISTA for l1-regularised problems;
``BatchedLBFGS`` (L-BFGS for smooth objectives) lives in the core module ``structtorch.optim``."""

from ..optim import BatchedLBFGS
from .bcfw import BCFW, EnsembleOracle, Oracle, StepInfo, one_hot_marginals, smoothed_oracle, tree_oracle
from .certificate import CertificateError, GapInfo, certificate
from .dcd import DualCD, independent_duals, independent_svms
from .proximal import BatchedFISTA
from .smoothing import ForestSmoothedMax, LPSmoothedMax, SmoothedHinge, SmoothedLBFGS, SmoothedMax, tree_smoothed_max

__all__ = ["BCFW", "BatchedFISTA", "BatchedLBFGS", "CertificateError", "DualCD", "EnsembleOracle", "ForestSmoothedMax",
           "GapInfo", "LPSmoothedMax", "Oracle", "SmoothedHinge", "SmoothedLBFGS", "SmoothedMax", "StepInfo",
           "certificate", "independent_duals", "independent_svms", "one_hot_marginals", "smoothed_oracle",
           "tree_oracle", "tree_smoothed_max"]
