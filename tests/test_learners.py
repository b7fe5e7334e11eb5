"""Learners: short CPU training runs of every learner with lightning.Trainer on synthetic data,
accuracy floors a broken learner cannot reach, a custom StructuredLearner subclass, argument
errors, saved hyper-parameters / load_from_checkpoint, and the Chow-Liu tree."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from conftest import EXCLUSIONS, beats_independent

from structtorch import Graph, Potentials
from structtorch.data import SyntheticDataModule, random_tree
from structtorch.energies import FinleyJoachimsEnergy, LinearTableEnergy, TreeEnsembleEnergy
from structtorch.inference import tree_sample
from structtorch.learners import LEARNERS, M3N, FixedTree, Independent, StructuredLearner
from structtorch.learners.rta import INTERACTION_CANDIDATES
from structtorch.structure import random_spanning_trees
from structtorch.structure.edge_scores import chow_liu_tree

EPOCHS = 12
LR = 0.05

pytestmark = [pytest.mark.usefixtures("quiet_single_thread"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec"),
              pytest.mark.filterwarnings("ignore:.*self.trainer. reference is not registered")]


def make_trainer(epochs: int = EPOCHS, **kwargs) -> L.Trainer:
    kwargs.setdefault("enable_checkpointing", False)
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, **kwargs)


def fit_and_test(model: StructuredLearner, dm: L.LightningDataModule, epochs: int = EPOCHS
                 ) -> tuple[L.Trainer, dict[str, float]]:
    trainer = make_trainer(epochs)
    trainer.fit(model, datamodule=dm)
    return trainer, trainer.test(model, datamodule=dm, verbose=False)[0]


def majority_hamming(y: torch.Tensor) -> float:
    """Hamming accuracy of predicting every label's majority value (measured on y itself)."""
    p = y.float().mean(0)
    return torch.maximum(p, 1 - p).mean().item()


def majority_subset(y: torch.Tensor) -> float:
    """Subset accuracy of always predicting the most frequent label vector of y."""
    return y.unique(dim=0, return_counts=True)[1].max().item() / len(y)


@pytest.fixture(scope="module")
def dm() -> SyntheticDataModule:
    """Labels are the exact MAP of a tree model whose edges are exclusions (conftest.EXCLUSIONS, 1000 examples
    each side): FixedTree on the true tree is well specified, and Independent cannot represent the labels."""
    return SyntheticDataModule(**{**EXCLUSIONS, "num_train": 1000, "num_test": 1000, "val_fraction": 0.1},
                               batch_size=32)


def learner(kind: str, dm: SyntheticDataModule, **kwargs) -> StructuredLearner:
    D, n = dm.num_features, dm.num_labels
    kwargs.setdefault("lr", LR)
    kwargs.setdefault("solver", "adam")  # the gradient path; the certified solvers have their own tests
    if kind == "independent":
        return Independent(D, n, **kwargs)
    edges = {"chain": lambda: Graph.chain(n).edges,
             "chow_liu": lambda: chow_liu_tree(dm.train_tensors[1]).edges,
             "true_tree": lambda: dm.dataset.tree.edges}[kind]()
    return FixedTree(D, n, edges=edges.tolist(), **kwargs)


@pytest.fixture(scope="module")
def trained(dm) -> dict[str, tuple[StructuredLearner, L.Trainer, dict[str, float]]]:
    """Every learner trained once (fixed seed, CPU): kind -> (model, trainer, test metrics)."""
    out = {}
    for kind in ("independent", "chain", "chow_liu", "true_tree"):
        L.seed_everything(0, verbose=False)
        model = learner(kind, dm)
        trainer, metrics = fit_and_test(model, dm)
        out[kind] = (model, trainer, metrics)
    return out


# ---------------------------------------------------------------------- training runs
@pytest.mark.parametrize("kind", ["independent", "chain", "chow_liu", "true_tree"])
def test_learner_trains_well_above_majority_baseline(kind, trained, dm):
    model, trainer, metrics = trained[kind]
    y_test = dm.test_tensors[1]
    assert trainer.current_epoch == EPOCHS
    assert set(metrics) >= {"test/hamming_acc", "test/subset_acc", "test/example_f1", "test/micro_f1",
                            "test/macro_f1"}
    assert all(0.0 <= v <= 1.0 for v in metrics.values())
    # a learner that ignores x (or predicts a constant) cannot beat these on the same test labels
    assert metrics["test/hamming_acc"] >= majority_hamming(y_test) + 0.10, metrics
    assert metrics["test/subset_acc"] >= majority_subset(y_test) + 0.20, metrics
    # the logged metrics are those of the model's own predictions
    x, y = dm.test_tensors
    with torch.no_grad():
        pred = model(x)
    assert pred.shape == y.shape and pred.dtype == torch.long
    assert abs((pred == y).float().mean().item() - metrics["test/hamming_acc"]) < 1e-6
    assert abs((pred == y).all(-1).float().mean().item() - metrics["test/subset_acc"]) < 1e-6


@pytest.mark.parametrize("kind", ["true_tree", "chow_liu"])
def test_the_right_tree_beats_independent(kind, trained):
    """Trained alike (Adam, 12 epochs), FixedTree on the true tree, and on the Chow-Liu tree of the training labels
    (the true tree here), beat Independent well outside test noise on exclusion labels (measured: subset 0.784 vs
    0.630, Hamming 0.951 vs 0.925; the old data gave 0.838 vs 0.795 and asked for +0.01)."""
    beats_independent(trained[kind][2], trained["independent"][2], subset=0.10, hamming=0.015)


def test_fixed_tree_learns_pairwise_weights_and_independent_has_none(trained, dm):
    ind, tree = trained["independent"][0], trained["true_tree"][0]
    assert ind.energy.graph.num_edges == 0
    assert torch.equal(tree.energy.graph.edges, dm.dataset.tree.edges)
    w = tree.energy.pairwise_weights().detach()
    assert w.shape == (dm.num_labels - 1,) and w.abs().max() > 0.1
    # signs of the strong true couplings are recovered
    true_w = dm.dataset.pairwise_weights.float()
    strong = true_w.abs() > 1.0
    assert strong.any()
    assert torch.equal(torch.sign(w[strong]), torch.sign(true_w[strong]))


def test_crf_loss_trains(dm):
    L.seed_everything(0, verbose=False)
    _, metrics = fit_and_test(learner("true_tree", dm, loss="crf"), dm, epochs=4)
    assert metrics["test/hamming_acc"] >= majority_hamming(dm.test_tensors[1]) + 0.10, metrics


@pytest.mark.parametrize("solver,lr_schedule", [("sgd", "none"), ("adamw", "cosine")])
def test_other_optimizers_train(dm, solver, lr_schedule):
    lr = 0.5 if solver == "sgd" else LR
    model = learner("chain", dm, solver=solver, lr_schedule=lr_schedule, lr=lr)
    trainer, metrics = fit_and_test(model, dm, epochs=3)
    opt = trainer.optimizers[0]
    assert type(opt).__name__.lower() == solver
    assert (len(trainer.lr_scheduler_configs) == 1) == (lr_schedule == "cosine")
    assert metrics["test/hamming_acc"] >= majority_hamming(dm.test_tensors[1]) + 0.10, metrics


def test_cosine_schedule_anneals_to_zero_over_max_epochs(trained):
    _, trainer, _ = trained["independent"]
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)


# ---------------------------------------------------------------------- a custom learner
# ---------------------------------------------------------------------- certified solvers through the Trainer
@pytest.mark.parametrize("kind,solver", [("independent", "dcd"), ("true_tree", "lbfgs")])
def test_default_solver_is_certified_and_stops_by_itself(kind, solver, dm):
    from structtorch.solvers.dcd import available

    solver = solver if solver != "dcd" or available() else "lbfgs"  # no compiler: Independent falls back to lbfgs
    L.seed_everything(0, verbose=False)
    model = learner(kind, dm, solver="auto", l2=0.01)
    trainer, metrics = fit_and_test(model, dm, epochs=500)
    assert model.solver_name == solver and trainer.current_epoch < 500  # stopped on its certificate
    report = model.solver_report()
    assert report["converged"] and 0 <= report["relative_gap"] <= 1e-3 and report["dual"] <= report["primal"]
    assert metrics["test/hamming_acc"] >= majority_hamming(dm.test_tensors[1]) + 0.10, metrics


def test_a_float32_lbfgs_fit_goes_on_in_float64_near_its_certificate(dm, monkeypatch):
    """Above ``FLOAT32_ABOVE`` potential entries (here every problem) L-BFGS starts in float32; once its relative gap
    is within ``FLOAT64_WITHIN`` times tol it goes on in float64 from where it is (its iterations, temperature and
    certificates' best points kept), and certifies at the float64 fit's optimum, its dual never above its primal."""
    from structtorch.strategies import certified

    monkeypatch.setattr(certified, "FLOAT32_ABOVE", 0)
    switches, finish = [], certified.LBFGSStrategy.finish_in_float64

    def spy(self):
        before = self.solver
        finish(self)
        if self.solver is not before:
            after = self.solver  # at the switch: the float32 fit's progress, carried over
            assert after.iterations == before.iterations and torch.equal(after.eps, before.eps.double())
            assert after.mixed is before.mixed and torch.equal(after.best.dual, before.best.dual)
            switches.append((before.params[0].dtype, before.iterations, before.eps.clone(), before.best.dual))

    monkeypatch.setattr(certified.LBFGSStrategy, "finish_in_float64", spy)
    L.seed_everything(0, verbose=False)
    model = learner("true_tree", dm, solver="auto", l2=0.01, solver_iters=5, independent_start=False)
    fit_and_test(model, dm, epochs=500)
    report, solver = model.solver_report(), model.strategy.solver
    assert report["converged"] and 0 <= report["relative_gap"] <= 1e-3 and report["dual"] <= report["primal"]
    assert len(switches) == 1 and switches[0][0] == torch.float32 and solver.params[0].dtype == torch.float64
    dtype, iterations, eps, dual = switches[0]
    assert solver.iterations > iterations and bool((solver.eps <= eps.double()).all())
    assert bool((solver.best.dual >= dual).all())  # the float32 certificates' dual kept
    monkeypatch.setattr(certified, "FLOAT32_ABOVE", 1 << 40)
    L.seed_everything(0, verbose=False)
    plain = learner("true_tree", dm, solver="auto", l2=0.01, solver_iters=5, independent_start=False)
    fit_and_test(plain, dm, epochs=500)
    assert plain.strategy.solver.params[0].dtype == torch.float64
    assert report["primal"] == pytest.approx(plain.solver_report()["primal"], rel=2e-3)


def test_independent_falls_back_to_lbfgs_where_the_dcd_kernel_does_not_build(monkeypatch):
    from structtorch.learners import baselines

    monkeypatch.setattr(baselines, "dcd_available", lambda: False)
    assert Independent(4, 3).solver_name == "lbfgs"
    monkeypatch.setattr(baselines, "dcd_available", lambda: True)
    assert Independent(4, 3).solver_name == "dcd" and Independent(4, 3, solver="lbfgs").solver_name == "lbfgs"


def test_crf_with_lbfgs_is_certified(dm):
    model = learner("true_tree", dm, solver="auto", loss="crf", l2=0.01)
    trainer, metrics = fit_and_test(model, dm, epochs=300)
    assert model.solver_name == "lbfgs" and trainer.current_epoch < 300
    assert model.solver_report()["converged"]
    assert metrics["test/hamming_acc"] >= majority_hamming(dm.test_tensors[1]) + 0.10, metrics


@pytest.mark.parametrize("averaging", [False, True])
def test_bcfw_solver_through_the_trainer(dm, averaging):
    model = learner("independent", dm, solver="bcfw", l2=1.0, tol=1e-2, bcfw_averaging=averaging)
    trainer, metrics = fit_and_test(model, dm, epochs=300)
    assert trainer.current_epoch < 300 and trainer.global_step > 0
    report = model.solver_report()
    assert report["solver"] == "bcfw" and report["converged"] and report["relative_gap"] <= 1e-2
    assert metrics["test/hamming_acc"] >= majority_hamming(dm.test_tensors[1]) + 0.05, metrics


def test_bcfw_passes_over_the_training_set_up_to_solver_iters_an_epoch_until_its_certificate(dm, monkeypatch):
    """As L-BFGS and DCD run up to solver_iters iterations an epoch, BCFW runs up to solver_iters passes an epoch
    until its certificate (RTA on yeast: 60 epochs of one pass ended at a gap of 0.19, 19.85% subset accuracy,
    below ECC's 20.07%; 20.28% with more passes): one epoch certifies; an uncertified epoch is solver_iters passes."""
    from structtorch.solvers import BCFW

    rows, step = [], BCFW.step
    monkeypatch.setattr(BCFW, "step", lambda self, x, y, index: (rows.append(len(x)), step(self, x, y, index))[1])
    certified = learner("true_tree", dm, solver="bcfw", l2=0.1, tol=1e-3)
    fit_and_test(certified, dm, epochs=1)
    report, N = certified.solver_report(), len(certified.strategy.x)
    assert report["converged"] and report["relative_gap"] <= 1e-3 and sum(rows) >= 2 * N
    rows.clear()
    capped = learner("true_tree", dm, solver="bcfw", l2=0.1, tol=1e-9, solver_iters=3)
    fit_and_test(capped, dm, epochs=2)
    assert not capped.solver_report()["converged"] and sum(rows) == 2 * 3 * N


def test_bcfw_with_default_bias_reg_certifies_what_lbfgs_learns(dm):
    """model.bias_reg=auto is 1 under bcfw: BCFW's dual certifies within a few dozen epochs (at the 1e-4 that lbfgs
    uses it stalled, a relative gap of 0.77 after 60 epochs on emotions) and predicts like the lbfgs fit."""
    bcfw = learner("independent", dm, solver="bcfw")
    trainer, metrics = fit_and_test(bcfw, dm, epochs=100)
    assert bcfw.solver_report()["converged"] and trainer.current_epoch < 100 and bcfw.bias_reg == 1.0
    lbfgs = learner("independent", dm, solver="lbfgs")
    assert lbfgs.bias_reg == 1e-4
    reference = fit_and_test(lbfgs, dm, epochs=100)[1]
    assert abs(metrics["test/hamming_acc"] - reference["test/hamming_acc"]) <= 0.01, (metrics, reference)
    with pytest.raises(ValueError, match="bias_reg must be 'auto' or a number > 0"):
        learner("independent", dm, bias_reg=0.0)


@pytest.mark.parametrize("independent_start", [True, False])
def test_certified_solver_resumes_from_a_checkpoint(dm, tmp_path, independent_start):
    """From Independent's solution (the default) and from w = 0. The resumed fit certifies within 500 epochs of 20
    L-BFGS iterations: when each epoch's fit went back to its best certified point, the start from Independent's
    solution held eps = 0.0049 at a relative gap of 1.5e-3 for 10,000 iterations (each epoch's progress undone)."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    first = learner("true_tree", dm, solver="lbfgs", l2=0.001, solver_iters=20, independent_start=independent_start)
    L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
              callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True)]).fit(first, datamodule=dm)
    assert not first.solver_report()["converged"]
    eps = float(first.strategy.solver.eps)
    second = learner("true_tree", dm, solver="lbfgs", l2=0.001, solver_iters=20, independent_start=independent_start)
    trainer = make_trainer(500)
    trainer.fit(second, datamodule=dm, ckpt_path=tmp_path / "last.ckpt")
    before, after = first.strategy.solver, second.strategy.solver
    assert after.iterations > before.iterations and float(after.eps) <= eps
    assert second.solver_report()["converged"] and trainer.current_epoch < 500


def test_an_uncertified_lbfgs_run_ends_on_its_best_certified_point(dm, tmp_path):
    """Each epoch's fit goes on from where it is; at the end of training an uncertified run goes back to its lowest
    certified primal (here its weights thrown off after the last epoch), certified against its highest dual, and a
    checkpoint holds that point's weights all along."""
    model = learner("true_tree", dm, solver="lbfgs", l2=0.001, solver_iters=20)
    trainer = make_trainer(2)
    trainer.fit(model, datamodule=dm)
    solver = model.strategy.solver
    assert not model.solver_report()["converged"]
    best = solver.best.params.clone()
    with torch.no_grad():
        for p in solver.params:
            p += 1.0
    solver.write_back()  # into the learner's energy (the solver may work on a float64 copy)
    thrown = solver.certify()
    assert float(thrown.primal) > float(solver.best.primal)
    trainer.save_checkpoint(tmp_path / "thrown.ckpt")
    saved = torch.load(tmp_path / "thrown.ckpt", weights_only=False)["state_dict"]
    names = [name for name, _ in model.energy.named_parameters()]
    in_checkpoint = torch.cat([saved[f"energy.{name}"].double().reshape(1, -1) for name in names], 1)
    torch.testing.assert_close(in_checkpoint, best, rtol=1e-6, atol=1e-7)
    model.strategy.train_end()
    assert torch.equal(solver.opt.slices.flat(), best)
    assert model.solver_report()["primal"] == pytest.approx(float(solver.best.primal), rel=0, abs=0)


@pytest.mark.parametrize("kwargs,match", [(dict(solver="bcfw", loss="crf"), "solver=bcfw"),
                                          (dict(solver="lbfgs", train_inference=lambda pot: pot.unary.sum((-1, -2))),
                                           "solver=lbfgs")])
def test_unavailable_solver_fails_before_training(dm, kwargs, match):
    model = learner("chain", dm, **kwargs)
    with pytest.raises(ValueError, match=match):
        make_trainer(1).fit(model, datamodule=dm)


@pytest.fixture(scope="module")
def grid_fit(dm):
    """Independent with a 3-value l2 grid and 3-fold CV, trained as one batched model."""
    L.seed_everything(0, verbose=False)
    model = learner("independent", dm, solver="auto", l2=[0.001, 0.03, 30.0], cv_folds=3)
    trainer, metrics = fit_and_test(model, dm, epochs=300)
    return model, trainer, metrics


def test_l2_grid_trains_every_fold_as_one_batched_model_and_picks_by_cv(grid_fit, dm):
    model, trainer, metrics = grid_fit
    assert model.num_models == 3 * 4 and model.energy.unary.weight.shape[0] == 12
    assert trainer.current_epoch < 300 and all(model.solver_report()["converged"])
    report = model.cv_report
    assert report["l2"] == [0.001, 0.03, 30.0] and report["folds"] == 3
    best = max(range(3), key=lambda g: report["scores"][g])
    assert report["chosen_l2"] == report["l2"][best] and report["chosen_l2"] != 30.0  # 30 underfits
    assert int(model.selected_model) == best * 4 + 3  # lambda's whole-training-set model predicts
    assert metrics["test/hamming_acc"] >= majority_hamming(dm.test_tensors[1]) + 0.10, metrics


def test_l2_grid_fold_model_equals_a_separate_run_on_its_fold(grid_fit, dm):
    """Model (lambda=0.03, fold 1) is the certified optimum of lambda=0.03 on the training set minus fold 1,
    and the CV score of lambda=0.03 is its held-out metric: recomputed here from separate runs."""
    from structtorch.energies import FinleyJoachimsEnergy
    from structtorch.solvers import SmoothedLBFGS
    model = grid_fit[0]
    x, y = dm.train_tensors
    fold = model.cv_folds_of(len(x))
    held_out = []
    for f in range(3):
        single = FinleyJoachimsEnergy(x.shape[1], y.shape[1]).double()
        info = SmoothedLBFGS(single, x.double()[fold != f], y[fold != f], 0.03, tol=1e-3).fit()
        batched = model.energy.unary.weight[1 * 4 + f].double()
        assert bool(info.converged)
        rel = (batched - single.unary.weight.detach()).norm() / single.unary.weight.norm()
        assert rel <= 0.05, (f, float(rel))  # both within a 1e-3 gap of the same strongly convex optimum
        with torch.no_grad():
            y_hat = (single(x.double()[fold == f]).unary.argmax(-1))
        held_out.append(float((y_hat == y[fold == f]).float().mean()))
    assert model.cv_report["scores"][1] == pytest.approx(sum(held_out) / 3, abs=0.01)


def test_l2_grid_checkpoint_keeps_the_chosen_model(grid_fit, dm, tmp_path):
    model, trainer, _ = grid_fit
    trainer.save_checkpoint(tmp_path / "grid.ckpt")
    loaded = Independent.load_from_checkpoint(tmp_path / "grid.ckpt")
    x = dm.test_tensors[0][:50]
    assert int(loaded.selected_model) == int(model.selected_model)
    assert torch.equal(loaded(x), model(x))


def test_l2_grid_needs_a_certified_solver(dm):
    with pytest.raises(ValueError, match="grid"):
        make_trainer(1).fit(learner("independent", dm, solver="adam", l2=[0.1, 1.0]), datamodule=dm)
    with pytest.raises(ValueError, match="l2"):
        Independent(3, 4, l2=[])
    with pytest.raises(ValueError, match="cv_folds"):
        Independent(3, 4, l2=[0.1, 1.0], cv_folds=1)
    with pytest.raises(ValueError, match="cv_metric"):
        Independent(3, 4, cv_metric="accuracy")


class TableLearner(StructuredLearner):
    """A new model in a few lines: K-state table energy on a chain over the labels."""

    def __init__(self, num_features: int, num_labels: int, input_dependent: bool = False, **kwargs) -> None:
        super().__init__(num_features, num_labels, **kwargs)

    def build_energy(self) -> LinearTableEnergy:
        hp = self.hparams
        return LinearTableEnergy(hp.num_features, hp.num_labels, num_states=2, graph=Graph.chain(hp.num_labels),
                                 input_dependent_pairwise=hp.input_dependent)


@pytest.mark.parametrize("input_dependent", [False, True])
def test_custom_subclass_with_table_energy_trains(dm, input_dependent, tmp_path):
    L.seed_everything(0, verbose=False)
    model = TableLearner(dm.num_features, dm.num_labels, input_dependent=input_dependent, lr=LR)
    assert isinstance(model.energy, LinearTableEnergy)
    trainer, metrics = fit_and_test(model, dm, epochs=4)
    assert metrics["test/hamming_acc"] >= majority_hamming(dm.test_tensors[1]) + 0.10, metrics
    # the custom learner round-trips through a checkpoint with its own hyper-parameters
    trainer.save_checkpoint(tmp_path / "table.ckpt")
    loaded = TableLearner.load_from_checkpoint(tmp_path / "table.ckpt")
    assert loaded.hparams.input_dependent == input_dependent
    x = dm.test_tensors[0][:50]
    assert torch.equal(loaded(x), model(x))


def test_base_learner_with_explicit_energy(dm):
    energy = FinleyJoachimsEnergy(dm.num_features, dm.num_labels, Graph.star(dm.num_labels))
    model = StructuredLearner(dm.num_features, dm.num_labels, energy=energy, solver="adam")
    assert model.energy is energy
    assert "energy" not in model.hparams
    x, y = dm.train_tensors
    with pytest.raises(RuntimeError, match="model.l2=auto is set from the number of training examples"):
        model.training_step((x[:16], y[:16]), 0)
    assert model.resolve_l2(len(x)) == [StructuredLearner.auto_l2 / len(x)]
    loss = model.training_step((x[:16], y[:16]), 0)  # the gradient strategy's loss: hinge + l2
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert energy.unary.weight.grad is not None and energy.edge_weight.grad is not None
    # hinge at zero weights: every label is predicted wrong by the loss-augmented argmax
    assert loss.item() == pytest.approx(dm.num_labels, abs=1e-6)


@pytest.mark.parametrize("name", ["independent", "tree_crf", "rta"])
def test_default_l2_scales_with_the_training_set(name, dm):
    """model.l2=auto is the learner's auto_l2 / N at fit start (in metrics.json's solver report): the same weight
    per example at any N (TreeCRF: at most 0.3, where its CV path starts); a given l2 is kept as given."""
    x, y = dm.train_tensors
    for rows in (len(x), len(x) // 3):
        small = SyntheticDataModule(num_train=rows, num_test=10, num_labels=dm.num_labels, val_fraction=0.0, seed=0)
        model = LEARNERS[name](dm.num_features, dm.num_labels)
        L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                  enable_model_summary=False).fit(model, datamodule=small)
        auto = min(model.auto_l2 / rows, model.max_auto_l2 or float("inf"))
        if name == "tree_crf":
            assert model.cv_report["l2"][0] == pytest.approx(auto)
            assert model.solver_report()["l2"] == [model.cv_report["chosen_l2"]]
        else:  # RTA: times the factor of the interactions interaction_l2=auto chose
            factor = dict(INTERACTION_CANDIDATES)[float(model.interaction_choice["chosen"])] if name == "rta" else 1
            assert model.solver_report()["l2"] == [pytest.approx(auto * factor)]
    if name == "tree_crf":  # a training set too small for 200 / N: the cap
        assert LEARNERS[name](dm.num_features, dm.num_labels).resolve_l2(100) == [0.3]
    given = LEARNERS[name](dm.num_features, dm.num_labels, l2=0.25)
    assert given.l2_grid == [0.25] and given.resolve_l2(17) == [0.25]
    with pytest.raises(ValueError, match="l2 must be 'auto', a number >= 0 or a non-empty list"):
        LEARNERS[name](dm.num_features, dm.num_labels, l2="automatic")


def test_custom_inference_callables_are_used(dm):
    calls = []

    def my_predict(pot: Potentials) -> torch.Tensor:
        calls.append(pot.unary.shape)
        return pot.unary.argmax(-1)

    model = Independent(dm.num_features, dm.num_labels, test_inference=my_predict)
    x = dm.test_tensors[0][:7]
    assert model(x).shape == (7, dm.num_labels)
    assert calls == [(7, dm.num_labels, 2)]


# ---------------------------------------------------------------------- errors
def test_structured_learner_without_energy_raises_not_implemented():
    with pytest.raises(NotImplementedError, match="build_energy"):
        StructuredLearner(num_features=3, num_labels=4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(loss="hingee"), "loss"),
    (dict(loss="mse"), "loss"),
    (dict(solver="adagrad"), "solver"),
    (dict(solver="Adam"), "solver"),
    (dict(train_inference="smoothed_lpp"), "train_inference"),
    (dict(test_inference="nope"), "test_inference"),
    (dict(bcfw_averaging="yes"), "bcfw_averaging"),
    (dict(bcfw_active_set=-1), "bcfw_active_set"),
    (dict(bcfw_active_set="yes"), "bcfw_active_set"),
])
def test_bad_learner_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Independent(3, 4, **kwargs)


def test_fixed_tree_rejects_a_cycle():
    with pytest.raises(ValueError, match="tree or forest"):
        FixedTree(3, 3, edges=[[0, 1], [1, 2], [2, 0]])


def test_learner_registry():
    assert LEARNERS["independent"] is Independent
    assert LEARNERS["fixed_tree"] is FixedTree
    assert all(issubclass(cls, StructuredLearner) for cls in LEARNERS.values())


# ---------------------------------------------------------------------- hyper-parameters, checkpoints
def test_hyperparameters_are_saved():
    model = FixedTree(5, 4, edges=[[0, 1], [1, 2], [1, 3]], loss="crf", l2=0.5, solver="sgd", lr=0.3,
                      lr_schedule="none", margin_scale=2.0)
    hp = model.hparams
    assert hp.num_features == 5 and hp.num_labels == 4
    assert hp.edges == [[0, 1], [1, 2], [1, 3]]
    assert (hp.loss, hp.l2, hp.solver, hp.lr, hp.lr_schedule, hp.margin_scale) == ("crf", 0.5, "sgd", 0.3,
                                                                                       "none", 2.0)
    ind = Independent(5, 4)
    assert ind.hparams.num_features == 5 and ind.hparams.num_labels == 4
    assert ind.hparams.loss == "hinge" and "edges" not in ind.hparams


def test_fixed_tree_with_empty_edges_is_independent():
    model = FixedTree(5, 4, edges=[])
    assert model.hparams.edges == [] and model.energy.graph.num_edges == 0


def test_fixed_tree_without_edges_waits_for_its_tree_from_the_data():
    model = FixedTree(5, 4)
    assert model.hparams.edges is None and model.hparams.tree == "chow_liu"
    with pytest.raises(RuntimeError, match="Trainer.fit"):
        model(torch.zeros(2, 5))


@pytest.mark.parametrize("kind", ["independent", "chow_liu"])
def test_load_from_checkpoint_rebuilds_an_equal_model(kind, trained, dm, tmp_path):
    model, trainer, _ = trained[kind]
    path = tmp_path / f"{kind}.ckpt"
    trainer.save_checkpoint(path)
    cls = type(model)
    loaded = cls.load_from_checkpoint(path)
    assert type(loaded) is cls
    assert dict(loaded.hparams) == dict(model.hparams)
    assert torch.equal(loaded.energy.graph.edges, model.energy.graph.edges)
    sd, sd_loaded = model.state_dict(), loaded.state_dict()
    assert sd.keys() == sd_loaded.keys()
    assert all(torch.equal(sd[k], sd_loaded[k]) for k in sd)
    x = dm.test_tensors[0]
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    # and the loaded model tests exactly like the original
    metrics = make_trainer().test(loaded, datamodule=dm, verbose=False)[0]
    assert metrics == pytest.approx(trained[kind][2], abs=1e-7)


# ---------------------------------------------------------------------- Chow-Liu
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chow_liu_recovers_the_tree_of_strongly_coupled_labels(seed):
    n = 7
    gen = torch.Generator().manual_seed(seed)
    tree = random_tree(n, seed)
    # Ising couplings of random sign and strength 1.5..2.5 on the tree, small random fields
    strength = (1.5 + torch.rand(tree.num_edges, generator=gen, dtype=torch.float64)) * \
        torch.where(torch.rand(tree.num_edges, generator=gen) < 0.5, -1.0, 1.0).double()
    sign = torch.tensor([[1.0, -1.0], [-1.0, 1.0]], dtype=torch.float64)
    pair = strength[:, None, None] * sign / 2
    unary = 0.3 * torch.randn(n, 2, generator=gen, dtype=torch.float64)
    y = tree_sample(Potentials(unary, pair, tree), 4000, generator=gen)  # [N, n]
    assert y.shape == (4000, n)
    learned = chow_liu_tree(y)
    assert learned.is_tree and learned.num_edges == n - 1
    as_set = lambda g: {tuple(sorted(e)) for e in g.edges.tolist()}  # noqa: E731
    assert as_set(learned) == as_set(tree)


def test_chow_liu_returns_a_spanning_tree_on_any_labels(dm):
    g = chow_liu_tree(dm.train_tensors[1])
    assert g.num_nodes == dm.num_labels and g.is_tree and g.num_edges == dm.num_labels - 1
    noise = torch.randint(0, 2, (50, 9), generator=torch.Generator().manual_seed(0))
    g = chow_liu_tree(noise)
    assert g.is_tree and g.num_edges == 8


def _all_labelings(n: int) -> torch.Tensor:
    """Every y in {0, 1}^n [2^n, n]."""
    return (torch.arange(2 ** n)[:, None] >> torch.arange(n)) & 1


@pytest.mark.parametrize("spin", [False, True])
def test_finley_joachims_scores_every_labeling_as_its_formula(spin):
    """score(x, y) over all 2^n labelings: sum_i y_i (w_i^T x + b_i) + sum_ij w_ij y_i y_j, or with spin
    w_ij s_i s_j (s = 2y - 1); the spin model is the indicator model with couplings 4 w_ij and biases
    b_i - 2 sum_j w_ij, up to a constant per x."""
    torch.manual_seed(0)
    n, D, graph = 4, 3, Graph.complete(4)
    energy = FinleyJoachimsEnergy(D, n, graph, spin=spin).double()
    with torch.no_grad():
        for p in energy.parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype))
    x, ys = torch.randn(5, D, dtype=torch.float64), _all_labelings(n)
    pot = energy(x)
    scores = torch.stack([pot.score(y.expand(5, n)) for y in ys], 1)  # [5, 2^n]
    s1 = energy.unary(x)  # [5, n]
    w, (i, j) = energy.edge_weight.detach(), graph.edges.T
    z = 2 * ys - 1 if spin else ys
    expected = ys.double() @ s1.T.detach() + ((z[:, i] * z[:, j]).double() @ w)[:, None]  # [2^n, 5]
    assert torch.allclose(scores, expected.T, atol=1e-12)
    if spin:  # the same score function as the reparametrised indicator model, up to a constant per x
        indicator = FinleyJoachimsEnergy(D, n, graph).double()
        with torch.no_grad():
            indicator.unary.weight.copy_(energy.unary.weight)
            degree_sum = torch.zeros(n, dtype=torch.float64).index_add_(0, i, w).index_add_(0, j, w)
            indicator.unary.bias.copy_(energy.unary.bias - 2 * degree_sum)
            indicator.edge_weight.copy_(4 * w)
        ipot = indicator(x)
        other = torch.stack([ipot.score(y.expand(5, n)) for y in ys], 1)
        assert torch.allclose(scores - other, (scores - other)[:, :1].expand_as(scores), atol=1e-12)


@pytest.mark.parametrize("spin", [False, True])
def test_finley_joachims_block_gram_equals_autograd(spin):
    """block_gram's node and edge parts sum to the Gram of the per-example gradients of <pot(x_b), d_b>
    (bias coordinates weighted by bias_scale), computed here by autograd."""
    torch.manual_seed(1)
    B, D, n, bias_scale = 4, 3, 4, 7.0
    energy = FinleyJoachimsEnergy(D, n, Graph.complete(n), spin=spin).double()
    x = torch.randn(B, D, dtype=torch.float64)
    d_u, d_p = torch.randn(B, n, 2, dtype=torch.float64), torch.randn(B, 6, 2, 2, dtype=torch.float64)
    grads = []
    for b in range(B):
        pot = energy(x[b:b + 1])
        inner = (pot.unary[0] * d_u[b]).sum() + (pot.pairwise * d_p[b]).sum()  # pairwise [E, 2, 2], shared
        g = torch.autograd.grad(inner, [energy.unary.weight, energy.unary.bias, energy.edge_weight])
        grads.append(torch.cat([g[0].flatten(), g[1] * bias_scale ** 0.5, g[2]]))
    gram = torch.stack(grads) @ torch.stack(grads).T
    nodes, edges = energy.block_gram(x, d_u, d_p, bias_scale)
    assert torch.allclose(nodes.sum(0) + edges.sum(0), gram, atol=1e-10)
    summed = energy.block_gram(x, d_u, d_p, bias_scale, summed=True)
    torch.testing.assert_close(summed, (nodes.sum(0), edges.sum(0)))


@pytest.mark.parametrize("input_dependent", [False, True])
@pytest.mark.parametrize("pairwise_l2", [1.0, 4.0])
def test_table_block_gram_equals_autograd_and_pairwise_l2_reparametrises(input_dependent, pairwise_l2):
    """LinearTableEnergy's block_gram parts sum to the autograd Gram of the per-example gradients of <pot(x_b), d_b>
    (biases weighted by bias_scale), also with ``pairwise_l2`` = r != 1, whose pairwise potentials are the pairwise
    parameters' times r^(-1/2): the same potentials as r = 1 with those parameters divided by sqrt(r)."""
    torch.manual_seed(2)
    B, D, n, K, bias_scale = 4, 3, 4, 3, 5.0
    energy = LinearTableEnergy(D, n, K, Graph.chain(n), input_dependent, pairwise_l2=pairwise_l2).double()
    with torch.no_grad():
        for p in energy.parameters():
            p.normal_()
    x = torch.randn(B, D, dtype=torch.float64)
    d_u, d_p = torch.randn(B, n, K, dtype=torch.float64), torch.randn(B, n - 1, K, K, dtype=torch.float64)
    named = list(energy.named_parameters())
    grads = []
    for b in range(B):
        pot = energy(x[b:b + 1])
        inner = (pot.unary[0] * d_u[b]).sum() + (pot.pairwise.reshape(n - 1, K, K) * d_p[b]).sum()
        g = torch.autograd.grad(inner, [p for _, p in named])
        grads.append(torch.cat([a.flatten() * (bias_scale ** 0.5 if name.endswith("bias") else 1.0)
                                for (name, _), a in zip(named, g)]))
    gram = torch.stack(grads) @ torch.stack(grads).T
    nodes, edges = energy.block_gram(x, d_u, d_p, bias_scale)
    torch.testing.assert_close(nodes.sum(0) + edges.sum(0), gram)
    plain = LinearTableEnergy(D, n, K, Graph.chain(n), input_dependent).double()
    with torch.no_grad():
        for (name, p), q in zip(named, plain.parameters()):
            q.copy_(p / pairwise_l2 ** 0.5 if name.startswith(("pairwise", "table")) else p)
    torch.testing.assert_close(plain(x).pairwise, energy(x).pairwise)
    with pytest.raises(ValueError, match="pairwise_l2 must be a finite number > 0, got 0"):
        LinearTableEnergy(D, n, K, pairwise_l2=0)


@pytest.mark.parametrize("kind", ["table", "ensemble"])
@pytest.mark.parametrize("models", [None, 2])
def test_block_gram_summed_is_the_sum_of_its_parts(kind, models):
    """``block_gram(..., summed=True)`` (BCFW's one block per example) gives the sums over nodes and over edges of
    the per-node and per-edge parts, with and without a model dim, for the table and ensemble energies."""
    gen = torch.Generator().manual_seed(4)
    B, D, n, K = 5, 3, 4, 3 if kind == "table" else 2
    if kind == "table":
        energy = LinearTableEnergy(D, n, K, Graph.chain(n), input_dependent_pairwise=True, num_models=models)
        E = n - 1
    else:
        energy = TreeEnsembleEnergy(D, random_spanning_trees(n, 3, gen), num_models=models)
        E = 3 * (n - 1)
    lead = () if models is None else (models,)
    x = torch.randn(B, D, generator=gen, dtype=torch.float64)
    d_u = torch.randn(*lead, B, n, K, generator=gen, dtype=torch.float64)
    d_p = torch.randn(*lead, B, E, K, K, generator=gen, dtype=torch.float64)
    energy = energy.double()
    nodes, edges = energy.block_gram(x, d_u, d_p, 3.0)
    summed = energy.block_gram(x, d_u, d_p, 3.0, summed=True)
    torch.testing.assert_close(summed, (nodes.sum(-3), edges.sum(-3)))


def test_spin_is_a_saved_hyperparameter_of_every_m3n_learner(tmp_path):
    m3n = [name for name, cls in LEARNERS.items() if issubclass(cls, M3N)]
    assert {"independent", "fixed_tree", "greedy", "mst", "full", "crank", "project"} <= set(m3n)
    assert Independent(3, 4).energy.spin  # the default
    model = FixedTree(3, 4, edges=Graph.chain(4).edges.tolist(), spin=False)  # not the default: must be restored
    assert not model.energy.spin and not model.hparams.spin
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                "pytorch-lightning_version": L.__version__}, tmp_path / "m.ckpt")
    loaded = FixedTree.load_from_checkpoint(tmp_path / "m.ckpt")
    assert not loaded.energy.spin
    x = torch.randn(5, 3)
    assert torch.equal(loaded.energy(x).pairwise, model.energy(x).pairwise)
    with pytest.raises(ValueError, match="spin must be a bool"):
        Independent(3, 4, spin="yes")
