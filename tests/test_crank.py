"""CRANK (circuit-rank regularised CCCP) and its FISTA inner solver."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from sklearn.linear_model import Lasso

from structtorch.data import SyntheticDataModule
from structtorch.learners import CRANK, LEARNERS
from structtorch.solvers import BatchedFISTA
from structtorch.structure import circuit_rank

pytestmark = [pytest.mark.usefixtures("quiet_single_thread"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec"),
              pytest.mark.filterwarnings("ignore:.*self.trainer. reference is not registered")]
F64 = torch.float64


# ---------------------------------------------------------------------- FISTA
def test_fista_solves_batched_lasso_with_exact_zeros():
    """Three lasso problems (one per l1 weight) at once equal sklearn's coordinate descent, zeros included."""
    rng = np.random.default_rng(0)
    A, b = rng.normal(size=(60, 15)), rng.normal(size=60)
    alphas = torch.tensor([0.01, 0.1, 0.4], dtype=F64)
    At, bt = torch.as_tensor(A), torch.as_tensor(b)
    w = torch.zeros(3, 15, dtype=F64, requires_grad=True)
    bias = torch.zeros(3, 1, dtype=F64, requires_grad=True)  # no l1 on this block
    smooth = lambda: 0.5 * ((w @ At.T + bias - bt) ** 2).mean(1)  # noqa: E731
    opt = BatchedFISTA([w, bias], smooth, [alphas, None])
    F = opt.run(5000, rel_tol=1e-13, patience=10)
    for m in range(3):
        ref = Lasso(alpha=float(alphas[m]), tol=1e-13, max_iter=200000).fit(A, b)
        assert torch.allclose(w[m].detach(), torch.as_tensor(ref.coef_), atol=1e-6)
        assert torch.equal(w[m].detach() == 0, torch.as_tensor(ref.coef_ == 0))
        assert abs(float(bias[m].detach()) - ref.intercept_) < 1e-6
    assert torch.allclose(F, smooth().detach() + alphas * w.detach().abs().sum(1))


def test_fista_objective_never_increases():
    rng = np.random.default_rng(1)
    X, y = torch.as_tensor(rng.normal(size=(40, 8))), torch.as_tensor(rng.integers(0, 2, 40)).to(F64)
    w = torch.zeros(2, 8, dtype=F64, requires_grad=True)
    smooth = lambda: torch.nn.functional.softplus(-(2 * y - 1) * (w @ X.T)).mean(1)  # noqa: E731
    opt = BatchedFISTA([w], smooth, [torch.tensor([0.001, 0.05], dtype=F64)])
    last = opt.F.clone()
    for _ in range(200):
        opt.step()
        assert bool((opt.F <= last + 1e-12).all())
        last = opt.F.clone()


def test_fista_bad_l1():
    w = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    with pytest.raises(ValueError, match=">= 0"):
        BatchedFISTA([w], lambda: (w ** 2).sum(1), [torch.tensor([0.1, -1.0], dtype=F64)])
    with pytest.raises(ValueError, match="one entry per parameter"):
        BatchedFISTA([w], lambda: (w ** 2).sum(1), [])


# ---------------------------------------------------------------------- CRANK
@pytest.fixture(scope="module")
def small() -> SyntheticDataModule:
    dm = SyntheticDataModule(num_train=300, num_test=1000, num_labels=6, batch_size=300, val_fraction=0.0, seed=3)
    dm.setup("fit")
    return dm


@pytest.fixture(scope="module")
def crank(small) -> tuple[CRANK, L.Trainer, list[dict]]:
    steps = []
    model = CRANK(small.num_features, small.num_labels, l2=0.01, restarts=3, inner_iters=60, beta=1e-4,
                  beta_growth=4.0)
    original = model.cccp_step
    model.cccp_step = lambda: steps.append({**original(), "all": model.last_objective.clone()}) or steps[-1]
    trainer = L.Trainer(accelerator="cpu", max_epochs=60, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model, datamodule=small)
    return model, trainer, steps


def test_crank_ends_on_a_forest_and_predicts_exactly(crank, small):
    model, trainer, steps = crank
    assert model.done and trainer.current_epoch < 60
    assert model.graph.is_forest and model.structure_mask.numel() == 15
    assert int(circuit_rank(model.structure_mask, model.restart_energy.graph)) == 0
    assert steps[-1]["train/circuit_rank"] == 0 and steps[0]["train/circuit_rank"] > 0  # started loopy
    assert model.structure_summary()["is_forest"]
    # the chosen restart has the lowest final objective among the restarts whose support is a forest
    assert int(model.best) == int(model.last_objective.argmin())


def test_crank_objective_decreases_within_each_beta(crank):
    """CCCP: l + beta f never increases while beta is fixed (up to the inner LP's tolerance)."""
    _, _, steps = crank
    for prev, cur in zip(steps, steps[1:]):
        if prev["train/beta"] == cur["train/beta"]:
            assert bool((cur["all"] <= prev["all"] + 1e-4 * prev["all"].abs()).all())


def test_crank_accuracy_floor(crank, small):
    """On tree-structured data CRANK's tree beats the majority-vote floor by a wide margin and matches
    independent per-label prediction at least (a broken learner or a wrong tree decode cannot)."""
    model, trainer, _ = crank
    metrics = trainer.test(model, datamodule=small, verbose=False)[0]
    y = small.test_tensors[1]
    majority = torch.maximum(y.float().mean(0), 1 - y.float().mean(0)).mean().item()
    assert metrics["test/hamming_acc"] >= max(0.95, majority + 0.1)
    assert metrics["test/subset_acc"] >= 0.5
    # a uniformly random spanning tree of 6 labels shares 25/15 ~ 1.7 edges with the true one on average
    learned = {tuple(sorted(e)) for e in model.graph.edges.tolist()}
    true = {tuple(sorted(e)) for e in small.dataset.tree.edges.tolist()}
    assert len(learned & true) >= 3


def test_crank_bad_input(small):
    for kwargs, match in (({"beta": 0.0}, "beta"), ({"beta_growth": 1.0}, "beta_growth"),
                          ({"restarts": 0}, "restarts"), ({"l2": [0.1, 1.0]}, "l2")):
        with pytest.raises(ValueError, match=match):
            CRANK(small.num_features, small.num_labels, **kwargs)
    model = CRANK(small.num_features, small.num_labels, solver="adam")
    with pytest.raises(ValueError, match="CCCP"):
        L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False).fit(model, datamodule=small)


def test_crank_is_a_cli_learner():
    assert LEARNERS["crank"] is CRANK


def test_crank_resumes_from_a_checkpoint(small, tmp_path):
    """A run stopped after 2 CCCP iterations and resumed keeps its restarts' weights, beta and iteration
    count, and finishes on a forest like an uninterrupted run."""
    kwargs = {"l2": 0.01, "restarts": 2, "inner_iters": 40, "beta": 1e-4, "beta_growth": 4.0}

    def trainer(epochs: int) -> L.Trainer:
        return L.Trainer(accelerator="cpu", max_epochs=epochs, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)

    first = CRANK(small.num_features, small.num_labels, **kwargs)
    trainer(2).fit(first, datamodule=small)
    assert not first.done and first.outer_iterations == 2
    ckpt = next(tmp_path.rglob("*.ckpt"))
    again = CRANK(small.num_features, small.num_labels, **kwargs)
    seen = {}
    original = again.on_fit_start
    again.on_fit_start = lambda: (seen.update(beta=float(again.beta), iters=again.outer_iterations,
                                              w=again.restart_energy.edge_weight.detach().clone()), original())[1]
    trainer(60).fit(again, datamodule=small, ckpt_path=str(ckpt))
    assert seen["beta"] == float(first.beta) and seen["iters"] == 2
    assert torch.equal(seen["w"], first.restart_energy.edge_weight.detach())
    assert again.done and again.graph.is_forest and again.outer_iterations > 2
