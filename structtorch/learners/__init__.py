"""Learners: LightningModules that train an energy with a structured loss and predict by inference."""

from .base import TEST_INFERENCE, TRAIN_INFERENCE, StructuredLearner
from .baselines import FixedTree, Full, Independent

LEARNERS = {"independent": Independent, "fixed_tree": FixedTree, "full": Full}

__all__ = ["LEARNERS", "TEST_INFERENCE", "TRAIN_INFERENCE", "FixedTree", "Full", "Independent", "StructuredLearner"]
