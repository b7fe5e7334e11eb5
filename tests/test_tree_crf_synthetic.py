"""The synthetic tree-CRF data of Bradley & Guestrin (ICML 2010): exact samplers against brute-force
enumeration of the factor product, the conditional CRF, structure, signs, seeding, arguments and a
Hydra smoke run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from structtorch.data import (
    TreeCRFSynthetic,
    TreeCRFSyntheticDataModule,
    random_attachment_tree,
    tree_crf_synthetic,
)
from structtorch.graph import Graph
from structtorch.train import build_datamodule, run

CONF = Path(__file__).resolve().parents[1] / "conf"
NUM_SAMPLES = 20_000
TV_BOUND = 0.05  # sampling noise of an exact sampler: expected TV <= 0.045 for 256 states and 20000 samples


# ---------------------------------------------------------------------- brute force
def all_binary(m: int) -> torch.Tensor:
    """All 2^m binary vectors [2^m, m] (int64), the first coordinate most significant."""
    return torch.tensor(list(itertools.product((0, 1), repeat=m)), dtype=torch.long)


def code(v: torch.Tensor) -> torch.Tensor:
    """Index [S] of binary vectors v [S, m] in ``all_binary(m)``'s order."""
    m = v.shape[-1]
    return (v.long() * (2 ** torch.arange(m - 1, -1, -1))).sum(-1)


def log_factors(d: TreeCRFSynthetic, y: torch.Tensor, x: torch.Tensor, yx: bool = True, yy: bool = True,
                xx: bool = True, cross: bool = True) -> torch.Tensor:
    """Sum of the chosen log factors at (y, x), each [S, n] -> [S], by explicit loops."""
    total = torch.zeros(len(y), dtype=torch.float64)
    for i in range(d.num_labels):
        total += d.yx[i, y[:, i], x[:, i]] * yx
    for e, (i, j) in enumerate(d.tree.edges.tolist()):
        total += d.yy[e, y[:, i], y[:, j]] * yy + d.xx[e, x[:, i], x[:, j]] * xx + d.cross[e, y[:, i], x[:, j]] * cross
    return total


def pairs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (y, x) pair, y-major: y [4^n, n], x [4^n, n]; row k has index code(y) * 2^n + code(x)."""
    b = all_binary(n)
    return b.repeat_interleave(2 ** n, 0), b.repeat(2 ** n, 1)


def brute_joint(d: TreeCRFSynthetic, cross: bool = True) -> torch.Tensor:
    """P(Y, X) [4^n] proportional to the product of all factors (cross factors optional)."""
    y, x = pairs(d.num_labels)
    return torch.softmax(log_factors(d, y, x, cross=cross), 0)


def brute_intractable(d: TreeCRFSynthetic) -> torch.Tensor:
    """P(X) P(Y | X) [4^n]: P(X) from the X-X factors alone, P(Y | X) by conditioning the factor product."""
    n = d.num_labels
    y, x = pairs(n)
    log_px = log_factors(d, y, x, yx=False, yy=False, cross=False).view(2 ** n, 2 ** n)[0].log_softmax(0)
    log_cond = log_factors(d, y, x, xx=False).view(2 ** n, 2 ** n).log_softmax(0)  # [y, x], normalised over y
    return (log_cond + log_px).exp().flatten()


def empirical(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Empirical distribution [4^n] of samples (y, x) in ``pairs``' order."""
    n = y.shape[1]
    counts = torch.bincount(code(y) * 2 ** n + code(x), minlength=4 ** n)
    return counts.double() / len(y)


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p - q).abs().sum())


# ---------------------------------------------------------------------- exact samplers
@pytest.mark.parametrize("n", [3, 4])
def test_tractable_sampler_matches_the_factor_product_and_needs_the_cross_factors(n):
    d = tree_crf_synthetic(NUM_SAMPLES, 1, num_labels=n, factors="random", strengths=(2.0, 2.0, 2.0),
                           joint="tractable", seed=n)
    emp = empirical(d.y_train, d.x_train)
    truth, without_cross = brute_joint(d), brute_joint(d, cross=False)
    assert tv(emp, truth) < TV_BOUND
    # a sampler that dropped the cross factors would fail the same bound
    assert tv(emp, without_cross) > 2 * TV_BOUND
    assert tv(truth, without_cross) > 2 * TV_BOUND


def test_intractable_sampler_draws_x_from_the_xx_tree_then_y_from_the_crf():
    d = tree_crf_synthetic(NUM_SAMPLES, 1, num_labels=3, factors="random", strengths=(2.0, 2.0, 2.0), seed=5)
    emp = empirical(d.y_train, d.x_train)
    assert tv(emp, brute_intractable(d)) < TV_BOUND
    assert tv(emp, brute_joint(d)) > 2 * TV_BOUND  # not the tractable joint


@pytest.mark.parametrize("structure", ["tree", "chain"])
def test_sampled_labels_for_a_fixed_x_follow_the_conditional_crf(structure):
    n = 4
    d = tree_crf_synthetic(1, 1, num_labels=n, structure=structure, factors="random", strengths=(2.0, 2.0, 2.0),
                           seed=7)
    x0 = torch.tensor([1, 0, 1, 1])
    y = d.sample_labels(x0.expand(NUM_SAMPLES, n), torch.Generator().manual_seed(0))
    assert y.shape == (NUM_SAMPLES, n) and y.dtype == torch.long
    emp = torch.bincount(code(y), minlength=2 ** n).double() / NUM_SAMPLES
    ys = all_binary(n)
    truth = torch.softmax(log_factors(d, ys, x0.expand(2 ** n, n), xx=False), 0)
    assert tv(emp, truth) < TV_BOUND


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 4), seed=st.integers(0, 10_000), structure=st.sampled_from(["tree", "chain"]),
       factors=st.sampled_from(["associative", "random"]), cross=st.booleans(), alternating=st.booleans())
def test_conditional_potentials_are_the_conditioned_factor_product(n, seed, structure, factors, cross, alternating):
    d = tree_crf_synthetic(1, 1, num_labels=n, structure=structure, factors=factors, strengths=(1.5, 2.5, 1.0),
                           cross=cross, alternating=alternating, seed=seed)
    y, x = pairs(n)
    truth = log_factors(d, y, x).view(2 ** n, 2 ** n).log_softmax(0).flatten()  # log P(y | x) by enumeration
    got = d.conditional_log_likelihood(x.float(), y)
    assert got.shape == (4 ** n,)
    torch.testing.assert_close(got, truth)
    pot = d.conditional_potentials(x)
    assert pot.unary.shape == (4 ** n, n, 2) and pot.graph == d.tree


# ---------------------------------------------------------------------- structure and factors
def test_chain_structure_is_a_path_and_the_dataset_fields_have_their_shapes():
    n = 7
    d = tree_crf_synthetic(30, 20, num_labels=n, structure="chain", seed=1)
    assert d.tree.edges.tolist() == [[i, i + 1] for i in range(n - 1)]
    assert d.x_train.shape == (30, n) and d.x_train.dtype == torch.float32
    assert d.y_train.shape == (30, n) and d.y_train.dtype == torch.int64
    assert d.x_test.shape == (20, n) and d.y_test.shape == (20, n)
    assert set(d.x_train.unique().tolist()) <= {0.0, 1.0} and set(d.y_train.unique().tolist()) <= {0, 1}
    assert d.num_labels == d.num_features == n and d.inputs == [[i] for i in range(n)]
    for name, rows in (("yy", n - 1), ("xx", n - 1), ("yx", n), ("cross", n - 1)):
        t = getattr(d, name)
        assert t.shape == (rows, 2, 2) and t.dtype == torch.float64, name


@pytest.mark.parametrize("seed", range(5))
def test_tree_edges_have_parent_before_child_and_form_a_sorted_tree(seed):
    n = 25
    d = tree_crf_synthetic(5, 5, num_labels=n, seed=seed)
    edges = d.tree.edges
    assert edges.shape == (n - 1, 2) and d.tree.is_tree
    assert (edges[:, 0] < edges[:, 1]).all()
    assert edges.tolist() == sorted(edges.tolist())
    assert sorted(edges[:, 1].tolist()) == list(range(1, n))  # each node i >= 1 has exactly one earlier parent
    mask = d.tree_edge_mask()
    complete = Graph.complete(n).edges.tolist()
    assert mask.dtype == torch.bool and mask.shape == (n * (n - 1) // 2,)
    assert {tuple(complete[k]) for k in mask.nonzero().flatten().tolist()} == {tuple(e) for e in edges.tolist()}


def test_random_attachment_is_uniform_over_the_attachment_sequences():
    """For n = 4 the parents (of node 1, 2, 3) are uniform over {0} x {0, 1} x {0, 1, 2}: 6 trees."""
    rng = np.random.default_rng(0)
    draws = 3000
    counts: dict[tuple, int] = {}
    for _ in range(draws):
        parents = tuple(p for p, _ in sorted(random_attachment_tree(4, rng).edges.tolist(), key=lambda e: e[1]))
        counts[parents] = counts.get(parents, 0) + 1
    assert set(counts) == {(0, a, b) for a in (0, 1) for b in (0, 1, 2)}
    assert all(abs(c / draws - 1 / 6) < 0.03 for c in counts.values())


def test_associative_alternating_signs():
    n = 6
    strengths, s_cross = (4.0, 2.0, 1.0), 3.0
    d = tree_crf_synthetic(1, 1, num_labels=n, cross_strength=s_cross, seed=2)
    eye = torch.eye(2, dtype=torch.float64)
    for name, s, rows in (("yy", 4.0, n - 1), ("yx", 2.0, n), ("xx", 1.0, n - 1), ("cross", s_cross, n - 1)):
        want = torch.stack([(-1) ** k * s * eye for k in range(rows)])
        torch.testing.assert_close(getattr(d, name), want, msg=name)
    fixed = tree_crf_synthetic(1, 1, num_labels=n, strengths=strengths, alternating=False, cross=False, seed=2)
    torch.testing.assert_close(fixed.yy, 4.0 * eye.expand(n - 1, 2, 2))
    torch.testing.assert_close(fixed.yx, 2.0 * eye.expand(n, 2, 2))
    assert (fixed.cross == 0).all()
    # cross factors default to the Y-X strength
    torch.testing.assert_close(tree_crf_synthetic(1, 1, num_labels=n, seed=2).cross[0], 2.0 * eye)


def test_random_factors_are_uniform_in_range_and_alternating_flips_every_other_sign():
    n, s = 30, (4.0, 2.0, 1.0)
    plain = tree_crf_synthetic(1, 1, num_labels=n, factors="random", strengths=s, alternating=False, seed=3)
    alt = tree_crf_synthetic(1, 1, num_labels=n, factors="random", strengths=s, alternating=True, seed=3)
    for name, bound in (("yy", 4.0), ("yx", 2.0), ("xx", 1.0), ("cross", 2.0)):
        t = getattr(plain, name)
        assert t.abs().max() <= bound and t.abs().max() > 0.5 * bound, name
        sign = (-1.0) ** torch.arange(len(t), dtype=torch.float64)
        torch.testing.assert_close(getattr(alt, name), t * sign[:, None, None], msg=name)


# ---------------------------------------------------------------------- seeding
@pytest.mark.parametrize("joint", ["intractable", "tractable"])
def test_seeded_and_nested(joint):
    kw = dict(num_labels=8, joint=joint, seed=3)
    small, big = tree_crf_synthetic(100, 40, **kw), tree_crf_synthetic(1100, 40, **kw)
    again = tree_crf_synthetic(100, 40, **kw)
    for name in ("x_train", "y_train", "x_test", "y_test", "yy", "xx", "yx", "cross"):
        assert torch.equal(getattr(small, name), getattr(again, name)), name
    assert small.tree == big.tree
    for name in ("x_test", "y_test", "yy", "xx", "yx", "cross"):
        assert torch.equal(getattr(small, name), getattr(big, name)), name
    mid = tree_crf_synthetic(600, 40, **kw)  # prefixes across the sampling-chunk boundaries
    for a, b in ((small, big), (mid, big), (small, mid)):
        m = len(a.x_train)
        assert torch.equal(a.x_train, b.x_train[:m]) and torch.equal(a.y_train, b.y_train[:m])
    other = tree_crf_synthetic(100, 40, **{**kw, "seed": 4})
    assert other.tree != small.tree or not torch.equal(other.x_train, small.x_train)


# ---------------------------------------------------------------------- arguments
@pytest.mark.parametrize("kwargs,match", [
    (dict(structure="ladder"), "structure"),
    (dict(factors="gaussian"), "factors"),
    (dict(joint="exact"), "joint"),
    (dict(num_labels=1), "num_labels"),
    (dict(num_labels=2.5), "num_labels"),
    (dict(num_train=0), "num_train"),
    (dict(num_test=-1), "num_test"),
    (dict(strengths=(4.0, -2.0, 1.0)), "strengths"),
    (dict(strengths=(4.0, 2.0)), "strengths"),
    (dict(strengths=(4.0, float("nan"), 1.0)), "strengths"),
    (dict(cross_strength=-1.0), "cross_strength"),
])
def test_bad_arguments_raise_value_error(kwargs, match):
    args = dict(num_train=5, num_test=5, num_labels=4)
    with pytest.raises(ValueError, match=match):
        tree_crf_synthetic(**{**args, **kwargs})


def test_conditional_potentials_reject_non_binary_or_misshapen_x():
    d = tree_crf_synthetic(1, 1, num_labels=4)
    with pytest.raises(ValueError, match="binary"):
        d.conditional_potentials(torch.full((2, 4), 2.0))
    with pytest.raises(ValueError, match="shape"):
        d.conditional_potentials(torch.zeros(2, 5))


# ---------------------------------------------------------------------- Hydra
def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_datamodule_holds_the_dataset():
    cfg = compose_cfg("data=tree_crf_synthetic")
    assert cfg.data.kind == "tree_crf_synthetic" and cfg.data.num_labels == 40 and cfg.data.num_train == 500
    assert cfg.data.num_test == 1000 and list(cfg.data.strengths) == [4.0, 2.0, 1.0] and cfg.data.cross
    dm = build_datamodule(compose_cfg("data=tree_crf_synthetic", "data.num_labels=5", "data.num_train=50",
                                      "data.num_test=30", "data.structure=chain").data)
    assert isinstance(dm, TreeCRFSyntheticDataModule)
    assert dm.num_labels == 5 and dm.num_features == 5
    assert isinstance(dm.dataset, TreeCRFSynthetic) and dm.dataset.tree == Graph.chain(5)
    assert dm.feature_names == [f"x{i}" for i in range(5)] and dm.label_names == [f"y{i}" for i in range(5)]
    x, y = dm.train_tensors
    assert len(x) + len(dm.val_tensors[0]) == 50 and len(dm.test_tensors[0]) == 30
    assert torch.equal(dm.test_tensors[1], dm.dataset.y_test)


@pytest.mark.usefixtures("quiet_single_thread")
@pytest.mark.filterwarnings("ignore:.*does not have many workers", "ignore:.*LeafSpec", "ignore:.*log_every_n_steps")
def test_train_run_writes_the_chow_liu_tree_and_learns(tmp_path):
    """``structtorch.train.run`` on the tree-CRF data with FixedTree: metrics.json holds the test metrics it
    returns, the Chow-Liu tree of the training labels (here the true tree, by label name), and a Hamming accuracy
    far above predicting each label's majority value (measured 0.835 vs 0.527; 0.89 / 0.88 vs 0.60 / 0.51 on
    seeds 1 and 2): a run that trains nothing, or ignores x, does not get there."""
    cfg = compose_cfg("data=tree_crf_synthetic", "data.num_labels=6", "data.num_train=200", "data.num_test=100",
                      "model=fixed_tree", "trainer.max_epochs=2", "logger=none", "trainer.enable_progress_bar=false",
                      "trainer.enable_checkpointing=false")
    metrics = run(cfg, tmp_path)
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["data"] == "tree_crf_synthetic" and written["model"] == "fixed_tree"
    assert set(written["per_label"]) == {f"y{i}" for i in range(6)}
    assert {k: v for k, v in written.items() if k.startswith("test/")} == {
        k: v for k, v in metrics.items() if k.startswith("test/")}
    dm = build_datamodule(cfg.data)
    dm.setup()
    true_tree = {(f"y{i}", f"y{j}") for i, j in dm.dataset.tree.edges.tolist()}
    assert {tuple(sorted(e[:2])) for e in written["structure"]["edges"]} == true_tree
    y = dm.test_tensors[1].float()
    majority = torch.maximum(y.mean(0), 1 - y.mean(0)).mean().item()
    assert metrics["test/hamming_acc"] >= majority + 0.2, (metrics["test/hamming_acc"], majority)
