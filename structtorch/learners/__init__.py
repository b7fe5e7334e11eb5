"""Learners: LightningModules that train an energy with a structured loss and predict by inference."""

from .base import TEST_INFERENCE, TRAIN_INFERENCE, StructuredLearner
from .baselines import M3N, MST, FixedTree, Full, Greedy, Independent
from .crank import CRANK, Project
from .logistic import LogisticEnergy
from .rta import MAM, RTA
from .tree_crf import TreeCRF

LEARNERS = {"independent": Independent, "fixed_tree": FixedTree, "full": Full, "crank": CRANK, "greedy": Greedy,
            "mst": MST, "project": Project, "tree_crf": TreeCRF, "rta": RTA, "mam": MAM, "logistic": LogisticEnergy}

__all__ = ["CRANK", "LEARNERS", "M3N", "MAM", "MST", "TEST_INFERENCE", "TRAIN_INFERENCE", "FixedTree", "Full", "Greedy",
           "Independent", "LogisticEnergy", "Project", "RTA", "StructuredLearner", "TreeCRF"]
