"""Learners: LightningModules that train an energy with a structured loss and predict by inference."""

from .base import TEST_INFERENCE, TRAIN_INFERENCE, StructuredLearner
from .baselines import FixedTree, Independent

LEARNERS = {"independent": Independent, "fixed_tree": FixedTree}

__all__ = ["LEARNERS", "TEST_INFERENCE", "TRAIN_INFERENCE", "FixedTree", "Independent", "StructuredLearner"]
