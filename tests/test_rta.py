"""RTA (max-margin ensembles of random spanning trees): energy, 0/1-margin BCFW, inference, learner."""

from __future__ import annotations

import itertools

import lightning as L
import pytest
import torch

from structtorch import Graph, Potentials
from structtorch.data import SyntheticDataModule
from structtorch.energies import FinleyJoachimsEnergy, TreeEnsembleEnergy
from structtorch.inference import ensemble_map, tree_kbest
from structtorch.inference.kbest import ensemble_union
from structtorch.learners import LEARNERS, RTA
from structtorch.solvers import BCFW, EnsembleOracle, tree_oracle
from structtorch.structure import random_spanning_trees

pytestmark = [pytest.mark.usefixtures("quiet_single_thread"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec"),
              pytest.mark.filterwarnings("ignore:.*self.trainer. reference is not registered")]
F64 = torch.float64


def all_assignments(n: int, K: int = 2) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(K), repeat=n)))  # [K^n, n]


def ensemble_scores(pot: Potentials, ys: torch.Tensor) -> torch.Tensor:
    """Mean tree score of every assignment ys [S, n] for a batch [B] ensemble -> [B, S], one tree at a time."""
    per_tree = []
    for t in range(pot.graph.num_graphs):
        g = Graph(pot.graph.num_nodes, pot.graph.edges[t])
        per_tree.append(Potentials(pot.unary, pot.pairwise[:, t], g).score(ys[:, None]).T)
    return torch.stack(per_tree).mean(0)


def random_energy(n: int, T: int, D: int = 5, seed: int = 0, **kwargs) -> TreeEnsembleEnergy:
    gen = torch.Generator().manual_seed(seed)
    energy = TreeEnsembleEnergy(D, random_spanning_trees(n, T, gen), **kwargs).to(F64)
    with torch.no_grad():
        for p in energy.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=F64))
    return energy


# ---------------------------------------------------------------------- energy and inference
def test_batched_trees_equal_a_loop_over_trees():
    """One batched energy of T trees gives, tree by tree, the potentials of T single-tree energies with
    the same weights; its ensemble score is the mean of the trees' scores."""
    n, T, D = 6, 4, 5
    energy = random_energy(n, T, D, seed=1)
    x = torch.randn(7, D, dtype=F64)
    pot = energy(x)
    assert pot.unary.shape == (7, n, 2) and pot.pairwise.shape == (7, T, n - 1, 2, 2)
    for t in range(T):
        single = TreeEnsembleEnergy(D, Graph(n, energy.graph.edges[t:t + 1])).to(F64)
        with torch.no_grad():
            single.weight.copy_(energy.weight[t:t + 1])
            single.bias.copy_(energy.bias[t:t + 1])
        torch.testing.assert_close(single(x).pairwise[:, 0], pot.pairwise[:, t])
    ys = all_assignments(n)
    torch.testing.assert_close(ensemble_union(pot).score(ys[:, None]).T, ensemble_scores(pot, ys))
    # normalisation: unit-norm inputs, each tree's features scaled by 1/sqrt(n-1)
    scaled = energy(3.0 * x).pairwise - energy.bias[None, ..., None].reshape(1, T, n - 1, 2, 2) / (n - 1) ** 0.5
    plain = pot.pairwise - energy.bias[None, ..., None].reshape(1, T, n - 1, 2, 2) / (n - 1) ** 0.5
    torch.testing.assert_close(scaled, plain)


@pytest.mark.parametrize("seed", range(4))
def test_certified_inference_equals_brute_force(seed):
    """Whenever Lemma 7 certifies it, ensemble_map's answer scores the brute-force max of the mean tree score
    (with and without the true label excluded), and the worst violator is never the excluded label."""
    n, T = 5, 3
    pot = random_energy(n, T, seed=seed)(torch.randn(40, 5, dtype=F64, generator=torch.Generator().manual_seed(seed)))
    ys = all_assignments(n)
    scores = ensemble_scores(pot, ys)  # [B, 32]
    y_true = ys[torch.randint(0, len(ys), (40,), generator=torch.Generator().manual_seed(seed))]
    for exclude in (None, y_true):
        y, score, certified, k_used = ensemble_map(pot, 1, k_max=8, exclude=exclude)
        masked = scores if exclude is None else scores.masked_fill((ys[None] == exclude[:, None]).all(-1), -1e300)
        assert certified.any()
        torch.testing.assert_close(score[certified], masked.amax(1)[certified])
        torch.testing.assert_close(ensemble_scores(pot, y[:, None].expand(-1, 1, n).reshape(-1, n))
                                   .diagonal(), score)
        assert ((k_used == 8) | certified).all()
        if exclude is not None:
            assert not (y == exclude).all(1).any()


def test_ensemble_candidates_memory_is_linear_in_trees():
    """Candidates are scored on the union graph: at most n(n-1)/2 distinct pairs however many trees."""
    n, T = 6, 40
    pot = random_energy(n, T)(torch.randn(3, 5, dtype=F64))
    union = ensemble_union(pot)
    assert union.graph.num_edges <= n * (n - 1) // 2 and union.pairwise.shape[-3] == union.graph.num_edges


# ---------------------------------------------------------------------- 0/1-margin BCFW
def brute_force_primal(energy, x, y, lam, bias_reg, margin_scale=1.0) -> float:
    """lambda/2 (|W|^2 + rho |b|^2) + mean_i max(0, margin + max_{y' != y_i} F(y') - F(y_i)), by enumeration."""
    with torch.no_grad():
        pot = energy(x)
        ys = all_assignments(pot.graph.num_nodes)
        scores = ensemble_scores(pot, ys) if pot.graph.is_ensemble else pot.score(ys[:, None]).T
        truth = (ys[None] == y[:, None]).all(-1)
        other = scores.masked_fill(truth, float("-inf")).amax(1)
        hinge = torch.relu(margin_scale + other - scores[truth]).mean()
        reg = sum(p.pow(2).sum() * (bias_reg if name.endswith("bias") else 1.0)
                  for name, p in energy.named_parameters())
        return float(0.5 * lam * reg + hinge)


@pytest.mark.parametrize("kind", ["ensemble", "tree"])
def test_zero_one_bcfw_certificate_against_enumeration(kind):
    """BCFW with the 0/1 margin: its primal equals the enumerated objective, its dual lower-bounds the
    objective at random weights, and it certifies a 5e-3 gap."""
    gen = torch.Generator().manual_seed(0)
    n, N, D = 5, 60, 4
    x = torch.randn(N, D, dtype=F64, generator=gen)
    y = (x[:, :1] + 0.5 * torch.randn(N, n, dtype=F64, generator=gen) > 0).long()
    if kind == "ensemble":
        energy = TreeEnsembleEnergy(D, random_spanning_trees(n, 3, gen)).to(F64)
        oracle = EnsembleOracle(2, 32)
    else:
        energy = FinleyJoachimsEnergy(D, n, Graph.chain(n)).to(F64)
        oracle = tree_oracle
    lam, rho = 0.05, 0.5
    solver = BCFW(energy, N, lam, oracle=oracle, margin="zero_one", bias_reg=rho, tol=5e-3)
    info = solver.fit(x, y, max_epochs=400, batch_size=16, generator=gen)
    assert bool(info.converged.all())
    assert float(info.primal) == pytest.approx(brute_force_primal(energy, x, y, lam, rho), rel=1e-9)
    if kind == "ensemble":
        assert oracle.stats()["certified"] == 1.0
    best = float(info.primal)
    for seed in range(5):  # weak duality: D <= P(w) for any w, hence D <= P*; and P* >= P - gap
        with torch.no_grad():
            for p in energy.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed), dtype=F64))
        assert float(info.dual) <= brute_force_primal(energy, x, y, lam, rho) + 1e-12
    assert float(info.dual) <= best


def test_zero_one_oracle_never_returns_the_label():
    gen = torch.Generator().manual_seed(3)
    pot = Potentials(torch.randn(30, 4, 2, generator=gen), torch.randn(30, 3, 2, 2, generator=gen), Graph.chain(4))
    y = tree_kbest(pot, 1)[1][:, 0]  # the MAP itself: the violator must differ
    _, mu_u, _ = tree_oracle(pot, exclude=y)
    assert not (mu_u.argmax(-1) == y).all(-1).any()


# ---------------------------------------------------------------------- learner
@pytest.fixture(scope="module")
def small() -> SyntheticDataModule:
    dm = SyntheticDataModule(num_train=300, num_test=1000, num_labels=6, batch_size=100, val_fraction=0.0, seed=3)
    dm.setup("fit")
    return dm


def trainer(tmp_path=None, epochs: int = 300) -> L.Trainer:
    return L.Trainer(accelerator="cpu", max_epochs=epochs, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=tmp_path is not None,
                     default_root_dir=tmp_path)


@pytest.fixture(scope="module")
def rta(small) -> tuple[RTA, L.Trainer]:
    model = RTA(small.num_features, small.num_labels, num_trees=5, k=2, l2=1e-3, normalize=False, tol=1e-2,
                margin="zero_one")
    t = trainer()
    t.fit(model, datamodule=small)
    return model, t


def test_rta_certified_training_and_accuracy_floor(rta, small):
    """RTA stops on its own certificate and beats the majority vote and independent linear SVMs (the
    labels come from a tree model; a broken learner, decoder or tree bookkeeping cannot do both)."""
    model, t = rta
    report = model.solver_report()
    assert report["solver"] == "bcfw" and report["converged"] and t.current_epoch < 300
    assert report["inference"]["train"]["certified"] >= 0.9
    metrics = t.test(model, datamodule=small, verbose=False)[0]
    y = small.test_tensors[1]
    majority = torch.maximum(y.float().mean(0), 1 - y.float().mean(0)).mean().item()
    assert metrics["test/hamming_acc"] >= majority + 0.1
    assert metrics["test/certified"] >= 0.9
    independent = LEARNERS["independent"](small.num_features, small.num_labels, l2=1e-3, solver="bcfw", tol=1e-2)
    it = trainer()
    it.fit(independent, datamodule=small)
    base = it.test(independent, datamodule=small, verbose=False)[0]
    assert metrics["test/subset_acc"] >= base["test/subset_acc"]


def test_rta_trees_come_back_from_the_seed(small, tmp_path):
    """A checkpoint resume redraws the same trees from the seed (and keeps them in the checkpoint); another
    seed is refused."""
    kwargs = dict(num_trees=4, k=2, l2=0.1, seed=5)
    first = RTA(small.num_features, small.num_labels, **kwargs)
    trainer(tmp_path, epochs=2).fit(first, datamodule=small)
    ckpt = str(next(tmp_path.rglob("*.ckpt")))
    again = RTA.load_from_checkpoint(ckpt)
    assert torch.equal(again.trees.edges, first.trees.edges)
    assert torch.equal(again.energy.tree_edges, first.trees.edges)
    torch.testing.assert_close(again(small.test_tensors[0][:50]), first(small.test_tensors[0][:50]))
    resumed = RTA(small.num_features, small.num_labels, **kwargs)
    trainer(tmp_path, epochs=3).fit(resumed, datamodule=small, ckpt_path=ckpt)
    assert torch.equal(resumed.trees.edges, first.trees.edges)
    other = RTA(small.num_features, small.num_labels, **{**kwargs, "seed": 6})
    with pytest.raises(ValueError, match="seed"):
        other.on_load_checkpoint(torch.load(ckpt, weights_only=False))


def test_rta_gradient_solver_and_hamming_margin(small):
    """The 0/1-margin hinge by Adam, and the Hamming-rescaled variant (the default) by BCFW, both learn."""
    for kwargs in ({"solver": "adam", "lr": 0.05, "margin": "zero_one"}, {"margin": "hamming"}):
        model = RTA(small.num_features, small.num_labels, num_trees=3, k=2, l2=1e-2, normalize=False, **kwargs)
        t = trainer(epochs=40)
        t.fit(model, datamodule=small)
        assert t.test(model, datamodule=small, verbose=False)[0]["test/hamming_acc"] >= 0.8


def test_rta_bad_input(small):
    D, n = small.num_features, small.num_labels
    for kwargs, match in (({"num_trees": 0}, "num_trees"), ({"k": 0}, "k"), ({"k": 4, "k_max": 2}, "k_max"),
                          ({"margin": "squared"}, "margin")):
        with pytest.raises(ValueError, match=match):
            RTA(D, n, **kwargs)
    with pytest.raises(ValueError, match="num_labels"):
        RTA(D, 1)
    with pytest.raises(ValueError, match="ensemble"):
        TreeEnsembleEnergy(D, Graph.chain(n))
    model = RTA(D, n, solver="lbfgs")
    with pytest.raises(ValueError, match="lbfgs"):
        L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False).fit(model, datamodule=small)


def test_rta_is_a_cli_learner():
    assert LEARNERS["rta"] is RTA


# ---------------------------------------------------------------------- MAM
def test_mam_trains_its_trees_separately_and_averages_max_marginals(small):
    """MAM's forest holds one copy of the labels per tree; with one tree it predicts that tree's MAP (the
    argmax of exact max-marginals); with five it learns (above the majority vote)."""
    one = LEARNERS["mam"](small.num_features, small.num_labels, num_trees=1, l2=1e-2)
    t = trainer(epochs=50)
    t.fit(one, datamodule=small)
    assert one.solver_report()["converged"]
    x = small.test_tensors[0][:200]
    with torch.no_grad():
        pot = one.tree_potentials(one.potentials(x))
    from structtorch.inference import tree_map
    torch.testing.assert_close(one(x), tree_map(pot)[1][:, 0])
    five = LEARNERS["mam"](small.num_features, small.num_labels, num_trees=5, l2=1e-2)
    assert five.energy.graph.num_nodes == 5 * small.num_labels and five.energy.graph.num_components == 5
    t = trainer(epochs=50)
    t.fit(five, datamodule=small)
    y = small.test_tensors[1]
    majority = torch.maximum(y.float().mean(0), 1 - y.float().mean(0)).mean().item()
    assert t.test(five, datamodule=small, verbose=False)[0]["test/hamming_acc"] >= majority + 0.1
    with pytest.raises(ValueError, match="num_trees"):
        LEARNERS["mam"](small.num_features, small.num_labels, num_trees=0)
