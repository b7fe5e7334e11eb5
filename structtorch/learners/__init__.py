"""Learners: LightningModules that train an energy with a structured loss and predict by inference."""

from .base import TEST_INFERENCE, TRAIN_INFERENCE, StructuredLearner
from .baselines import FixedTree, Full, Independent
from .crank import CRANK

LEARNERS = {"independent": Independent, "fixed_tree": FixedTree, "full": Full, "crank": CRANK}

__all__ = ["CRANK", "LEARNERS", "TEST_INFERENCE", "TRAIN_INFERENCE", "FixedTree", "Full", "Independent",
           "StructuredLearner"]
