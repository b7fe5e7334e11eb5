"""The Full baseline: complete graph, smoothed-LP hinge, warm-started messages, LP prediction."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from conftest import beats_independent, exclusion_data

from structtorch import Graph, Potentials
from structtorch.data import SyntheticDataModule
from structtorch.inference import brute_force_map, lp_map
from structtorch.learners import Full
from structtorch.losses import hamming_augment, structured_hinge


def _fit(model: L.LightningModule, dm: L.LightningDataModule, epochs: int) -> dict:
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, datamodule=dm)
    return trainer.test(model, datamodule=dm, verbose=False)[0]


@pytest.fixture(scope="module")
def synthetic() -> SyntheticDataModule:
    return SyntheticDataModule(num_train=300, num_test=300, num_labels=6, batch_size=50, val_fraction=0.0, seed=3)


def test_full_learns_and_beats_majority(synthetic: SyntheticDataModule) -> None:
    L.seed_everything(0)
    model = Full(synthetic.num_features, synthetic.num_labels, lr=0.05, l2=0.01, solver="adam")
    metrics = _fit(model, synthetic, epochs=8)
    y_test = synthetic.test_tensors[1].float()
    majority = torch.maximum(y_test.mean(0), 1 - y_test.mean(0)).mean().item()
    assert metrics["test/hamming_acc"] >= majority + 0.05
    # every training example got warm-start messages, and they are not all zero
    assert model.example_state.num_examples("messages") >= len(synthetic.train_tensors[0])
    assert model.example_state.messages[: len(synthetic.train_tensors[0])].abs().sum() > 0


def test_full_beats_independent_on_coupled_labels(independent_on_exclusions) -> None:
    """Trained to its certificate (default solver) on labels only their interactions explain (conftest.EXCLUSIONS),
    Full's complete graph learns the exclusions: well above Independent (measured: subset 0.865 vs 0.641, Hamming
    0.969 vs 0.928; 0.78 - 0.81 vs 0.59 - 0.63 subset on seeds 0-2). On the old data Independent was at 0.95 subset
    and Full was only asked not to lose more than 6 of 300 examples to it."""
    dm = exclusion_data(batch_size=300)
    L.seed_everything(0)
    model = Full(dm.num_features, dm.num_labels, l2=0.01)
    beats_independent(_fit(model, dm, epochs=50), independent_on_exclusions, subset=0.12, hamming=0.02)
    assert model.solver_report()["converged"]


def test_full_lp_map_prediction_path() -> None:
    """test_inference="lp_map" decodes by ``lp_map``; the default smoothed decoding mostly agrees with it on 5 labels
    (200 rows: 0.93 - 0.99 of the labels on seeds 0-9). Seeded by ``conftest.seeded_rng``: on 6 rows drawn from
    whatever RNG state the tests before it left, agreement fell to 0.70."""
    model = Full(4, 5, test_inference="lp_map")
    with torch.no_grad():
        model.energy.unary.weight.normal_()
        model.energy.edge_weight.normal_(0, 0.25)  # a spin w_ij is 4 w_ij y_i y_j: sd 1 in the indicator form
    x = torch.randn(200, 4)
    y_lp = model(x)
    pot = model.energy(x)
    assert torch.equal(y_lp, lp_map(pot).assignment)
    model_s = Full(4, 5)
    model_s.load_state_dict(model.state_dict())
    assert (model_s(x) == y_lp).float().mean() >= 0.9  # a decoder unrelated to the LP's agrees on about half


def test_full_hinge_upper_bounds_exact_hinge() -> None:
    """Smoothed-LP loss-augmented max >= exact max, so Full's loss >= the exact structured hinge."""
    torch.manual_seed(0)
    model = Full(3, 5, iters=200)
    with torch.no_grad():
        model.energy.unary.weight.normal_()
        model.energy.edge_weight.normal_()
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8, 5))
    pot = model.energy(x)
    exact = brute_force_map(hamming_augment(pot, y))[0] - pot.score(y)
    assert (model.loss(pot, y) >= exact - 1e-4).all()
    tree_pot = Potentials(pot.unary, pot.pairwise[:0], Graph.empty(5))
    assert (structured_hinge(tree_pot, y) >= 0).all()


def test_full_rejects_unknown_test_inference() -> None:
    with pytest.raises(ValueError, match="test_inference must be 'smoothed_lp' or 'lp_map'"):
        Full(3, 4, test_inference="tree_map")


def test_full_default_solver_certifies_the_lp_relaxed_objective(synthetic: SyntheticDataModule) -> None:
    model = Full(synthetic.num_features, synthetic.num_labels, l2=0.1)
    trainer = L.Trainer(max_epochs=200, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, datamodule=synthetic)
    report = model.solver_report()
    assert report["solver"] == "lbfgs" and report["converged"] and trainer.current_epoch < 200
    with torch.no_grad():  # the certified primal is an upper bound on the exact LP-relaxed objective (HiGHS)
        x, y = synthetic.train_tensors
        pot = model.energy(x)
        lp = (lp_map(hamming_augment(pot, y)).value - pot.score(y)).double().mean()
        reg = 0.05 * sum((p.double().pow(2) * (1e-4 if n.endswith("bias") else 1.0)).sum()
                         for n, p in model.energy.named_parameters())
    assert float(lp + reg) <= report["primal"] * (1 + 1e-4) and report["primal"] <= float(lp + reg) * (1 + 2e-3)
