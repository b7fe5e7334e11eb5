"""The training-strategy protocol: StructuredLearner drives every learner's training through its strategy; no
learner overrides Lightning's training loop; a new learner is an energy plus a strategy of its own."""

from __future__ import annotations

import inspect

import lightning as L
import pytest
import torch

from structtorch import Graph
from structtorch.data import SyntheticDataModule
from structtorch.energies import FinleyJoachimsEnergy
from structtorch.inference import tree_map
from structtorch.learners import CRANK, LEARNERS, FixedTree, LogisticEnergy, StructuredLearner
from structtorch.losses import total_score
from structtorch.strategies import CCCP, Algorithm1, BCFWStrategy, Gradient, LBFGSStrategy, Strategy

pytestmark = [pytest.mark.usefixtures("quiet_single_thread"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec")]

#: the LightningModule hooks that decide how a model trains: only StructuredLearner defines them
TRAINING_LOOP = ("training_step", "configure_optimizers", "on_fit_start", "on_train_epoch_start",
                 "on_train_epoch_end", "on_train_end", "on_before_optimizer_step", "optimizer_step", "backward",
                 "manual_backward", "on_train_batch_start", "on_train_batch_end")


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_no_learner_overrides_the_training_loop(name):
    """Every learner trains through ``StructuredLearner``'s hooks and its strategy (CRANK: CCCP; LogisticEnergy:
    Domke's Algorithm 1), so none of them defines a training-loop hook of its own."""
    cls = LEARNERS[name]
    for klass in cls.__mro__[:cls.__mro__.index(StructuredLearner)]:
        overridden = sorted(set(TRAINING_LOOP) & set(vars(klass)))
        assert not overridden, f"{klass.__name__} overrides {overridden}"


def test_the_base_learner_never_asks_which_solver_it_holds():
    source = inspect.getsource(inspect.getmodule(StructuredLearner))
    for solver in ("BCFW", "SmoothedLBFGS", "BatchedFISTA", "LBFGSStrategy", "BCFWStrategy", "CCCP"):
        assert f"isinstance(self.strategy, {solver}" not in source and f", {solver})" not in source


@pytest.fixture(scope="module")
def dm() -> SyntheticDataModule:
    return SyntheticDataModule(num_train=400, num_test=400, num_labels=6, batch_size=32, seed=0)


def test_each_learner_names_its_strategy(dm):
    D, n = dm.num_features, dm.num_labels
    tree = Graph.chain(n).edges.tolist()
    assert isinstance(FixedTree(D, n, edges=tree).strategy, LBFGSStrategy)  # auto: a linear energy on a tree
    assert isinstance(FixedTree(D, n, edges=tree, solver="bcfw").strategy, BCFWStrategy)
    assert isinstance(FixedTree(D, n, edges=tree, solver="sgd").strategy, Gradient)
    assert isinstance(CRANK(D, n).strategy, CCCP)
    grid = dict(height=2, width=3, num_pair_features=2)
    assert isinstance(LogisticEnergy(2, 6, **grid).strategy, Algorithm1)
    assert isinstance(LogisticEnergy(2, 6, **grid, method="hinge").strategy, Gradient)


class Perceptron(Strategy):
    """The structured perceptron (Collins 2002) as a strategy: w += phi(x, y) - phi(x, y_hat) on every batch."""

    name = "perceptron"

    def training_step(self, batch: tuple, batch_idx: int) -> None:
        energy = self.learner.energy
        pot = energy(batch[0])
        y_hat = tree_map(pot.detach())[1]
        mistakes = (total_score(pot, y_hat) - total_score(pot, batch[1])).sum()
        with torch.no_grad():
            for p, g in zip(energy.parameters(), torch.autograd.grad(mistakes, list(energy.parameters()))):
                p -= g
        self.step_counter()


class PerceptronTree(StructuredLearner):
    """A new learner: an energy and a strategy, nothing else."""

    def build_energy(self) -> FinleyJoachimsEnergy:
        return FinleyJoachimsEnergy(self.hparams.num_features, self.hparams.num_labels,
                                    Graph.chain(self.hparams.num_labels))

    def build_strategy(self) -> Strategy:
        return Perceptron(self)

    @property
    def solver_name(self) -> str:
        return "perceptron"


def test_a_new_learner_is_an_energy_and_a_strategy(dm, tmp_path):
    model = PerceptronTree(dm.num_features, dm.num_labels)
    trainer = L.Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=dm)
    acc = trainer.test(model, datamodule=dm, verbose=False)[0]["test/hamming_acc"]
    y = dm.test_tensors[1].float()
    majority = torch.maximum(y.mean(0), 1 - y.mean(0)).mean().item()
    assert trainer.global_step == 5 * len(dm.train_dataloader())  # Lightning counted the strategy's updates
    assert acc >= majority + 0.1, (acc, majority)
    assert model.solver_report()["solver"] == "perceptron"


def test_logistic_energy_rejects_a_regulariser_algorithm_1_does_not_have():
    with pytest.raises(ValueError, match="model.method=logistic .* has no regulariser: model.l2 must be 0"):
        LogisticEnergy(2, 6, height=2, width=3, num_pair_features=2, l2=0.1)
    LogisticEnergy(2, 6, height=2, width=3, num_pair_features=2, method="hinge", l2=0.1)  # the hinge uses it


def test_certified_solvers_need_a_positive_l2(dm):
    model = FixedTree(dm.num_features, dm.num_labels, edges=Graph.chain(dm.num_labels).edges.tolist(), l2=0.0)
    with pytest.raises(ValueError, match="solver=lbfgs certifies a strongly convex objective: model.l2 must be > 0"):
        L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False).fit(model, datamodule=dm)
