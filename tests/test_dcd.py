"""solver=dcd (``DualCD``): liblinear's dual coordinate descent on one linear SVM per label (Independent), on the
fused CPU kernel ``svm_dcd``: the kernel against a plain-Python epoch, the certified optimum against BCFW's and
liblinear's, the folds of a grid against separate runs, the learner's default, and bad input."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structtorch.energies import FinleyJoachimsEnergy
from structtorch.graph import Graph
from structtorch.learners import FixedTree, Independent
from structtorch.solvers import BCFW, DualCD
from structtorch.solvers.dcd import SparseRows

fused = pytest.importorskip("structtorch.inference.fused")
try:
    fused.kernels()
except RuntimeError as err:  # no C++ compiler here
    pytest.skip(f"the fused CPU kernels do not build here: {err}", allow_module_level=True)


def problem(N: int, D: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    y = (x @ torch.randn(D, n, generator=g, dtype=torch.float64) + 0.5 * torch.randn(N, n, generator=g,
                                                                                    dtype=torch.float64) > 0.3)
    return x, y.long()


def python_epochs(x, sign, order, alpha, w, C):
    """The coordinate steps of ``svm_dcd``, one (row, label) at a time in plain Python."""
    q = (x * x).sum(1)
    for epoch in order:
        for i in epoch.tolist():
            for label in range(sign.shape[1]):
                s = float(sign[i, label])
                a = float(alpha[label, i])
                nxt = min(max(a - (s * float(w[label] @ x[i]) - 1.0) / float(q[i]), 0.0), C)
                alpha[label, i] = nxt
                w[label] += (nxt - a) * s * x[i]


@pytest.mark.parametrize("n,D", [(3, 4), (19, 7), (40, 1)])  # one partial block; several with a remainder; D = 1
def test_kernel_equals_plain_python_coordinate_steps(n, D):
    x, y = problem(23, D, n, seed=n)
    sign = (2.0 * y - 1.0).double().contiguous()
    order = torch.stack([torch.randperm(23, generator=torch.Generator().manual_seed(e)) for e in range(3)])
    alpha, w = torch.zeros(n, 23, dtype=torch.float64), torch.zeros(n, D, dtype=torch.float64)
    fused.kernels().svm_dcd(x.contiguous(), sign, order, alpha, w, 0.7)
    ref_alpha, ref_w = torch.zeros_like(alpha), torch.zeros_like(w)
    python_epochs(x, sign, order, ref_alpha, ref_w, 0.7)
    torch.testing.assert_close(alpha, ref_alpha, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)
    assert float(alpha.min()) >= 0.0 and float(alpha.max()) <= 0.7


@settings(max_examples=15, deadline=None, derandomize=True)
@given(N=st.integers(2, 14), D=st.integers(1, 4), n=st.integers(1, 3), lam=st.floats(0.05, 3.0),
       rho=st.sampled_from([1.0, 0.1]), seed=st.integers(0, 10_000))
def test_certified_optimum_equals_bcfw_s_and_the_gap_is_never_negative(N, D, n, lam, rho, seed):
    """Both solvers certify the same objective (biases regularised with weight rho) to 1e-7: their primal values
    agree; every certificate on the way has P >= D (``certificate`` raises otherwise). (At lambda N near 0.1, C = 10,
    coordinate descent needs many thousands of epochs for 1e-7, as liblinear does at large C.)"""
    x, y = problem(N, D, n, seed)
    energy = FinleyJoachimsEnergy(D, n).double()
    dcd = DualCD(energy, x, y, lam, bias_reg=rho, tol=1e-7)
    gaps = []
    for _ in range(1000):
        info = dcd.fit(max_epochs=dcd.epochs + 5)  # rho < 1: by the continuation's stages
        gaps += [float(info.gap), float(dcd.stage_gap.gap)]
        if bool(info.converged.all()):
            break
    assert bool(info.converged.all()) and min(gaps) >= -1e-9
    reference = FinleyJoachimsEnergy(D, n).double()
    bcfw = BCFW(reference, N, lam, bias_reg=rho, tol=1e-7)
    for _ in range(3000):
        bcfw.step(x, y, torch.arange(N))
        if bool(bcfw.duality_gap([(x, y, torch.arange(N))]).converged.all()):
            break
    best = bcfw.duality_gap([(x, y, torch.arange(N))])
    assert float(info.primal) == pytest.approx(float(best.primal), rel=3e-6, abs=1e-9)
    # the energy holds the certified weights
    with torch.no_grad():
        margins = (2.0 * y - 1.0) * (x @ energy.unary.weight.T + energy.unary.bias)
        primal = lam / 2 * (energy.unary.weight.pow(2).sum() + rho * energy.unary.bias.pow(2).sum()) \
            + (1 - margins).clamp_min(0).sum() / N
    assert float(primal) == pytest.approx(float(info.primal), rel=1e-12)


def test_objective_is_liblinears_within_half_a_percent():
    """C = 1 / (lambda N), the bias as an input of 1 (rho = 1): sklearn's LinearSVC(loss="hinge") per label."""
    svm = pytest.importorskip("sklearn.svm")
    x, y = problem(120, 6, 4, seed=3)
    lam = 100.0 / 120
    info = DualCD(FinleyJoachimsEnergy(6, 4).double(), x, y, lam, tol=1e-3).fit()
    ours, theirs = float(info.primal), 0.0
    for label in range(4):
        c = svm.LinearSVC(loss="hinge", C=1 / (lam * 120), intercept_scaling=1, tol=1e-6, max_iter=100_000)
        c.fit(x.numpy(), y[:, label].numpy())
        w, b = torch.from_numpy(c.coef_[0]), float(c.intercept_[0])
        t = 2.0 * y[:, label].double() - 1.0
        theirs += lam / 2 * (float(w @ w) + b * b) + float((1 - t * (x @ w + b)).clamp_min(0).sum()) / 120
    assert bool(info.converged.all()) and ours <= theirs * 1.005 and ours >= float(info.dual) - 1e-12


@pytest.mark.parametrize("sparse", [False, True])
def test_folds_of_a_grid_equal_separate_runs(sparse):
    """Also with sparse rows (``SparseRows``: every model's steps and certificate through z's nonzeros)."""
    x, y = sparse_problem(90, 40, 3, seed=2) if sparse else problem(30, 3, 2, seed=5)
    x = x[:, :-1] if sparse else x
    N, D, n = len(x), x.shape[1], y.shape[1]
    mask = torch.stack([torch.arange(N) % 3 != 0, torch.ones(N, dtype=torch.bool)])
    lam = torch.tensor([0.05, 0.02] if sparse else [0.5, 0.2], dtype=torch.float64)
    batched = DualCD(FinleyJoachimsEnergy(D, n, num_models=2).double(), x, y, lam, tol=1e-9, mask=mask)
    assert (batched.rows is not None) == sparse
    info = batched.fit(max_epochs=5000)
    for m in range(2):
        rows = mask[m]
        alone = DualCD(FinleyJoachimsEnergy(D, n).double(), x[rows], y[rows], float(lam[m]), tol=1e-9).fit(5000)
        assert float(info.primal[m]) == pytest.approx(float(alone.primal), rel=1e-7)


def test_state_restores_the_certificate():
    x, y = problem(25, 3, 2, seed=7)
    first = DualCD(FinleyJoachimsEnergy(3, 2).double(), x, y, 0.3)
    first.run(4)
    before = first.certify()
    again = DualCD(FinleyJoachimsEnergy(3, 2).double(), x, y, 0.3)
    again.load_state_dict(first.state_dict())
    assert again.epochs == 4 and float(again.last.primal) == float(before.primal)
    with pytest.raises(ValueError, match="does not match"):
        DualCD(FinleyJoachimsEnergy(3, 3).double(), x, torch.cat([y, y[:, :1]], 1), 0.3).load_state_dict(
            first.state_dict())


@pytest.mark.parametrize("shape", [(200, 20, 5), (300, 50, 8)])
def test_continuation_certifies_a_small_bias_reg_in_a_fraction_of_the_epochs(shape):
    """At rho = 1e-4 (the bias input 100) coordinate steps from alpha = 0 move little but the bias: 910 and 1150
    epochs to a gap of 1e-3 on these problems, against 30 and 35 through the stages rho' = 1, 0.1, ... (rho's
    certificate, of the stage's weights, may be met before the last stage); both end at the same objective."""
    N, D, n = shape
    x, y = problem(N, D, n, seed=1)
    staged = DualCD(FinleyJoachimsEnergy(D, n).double(), x, y, 100.0 / N, bias_reg=1e-4, tol=1e-3)
    direct = DualCD(FinleyJoachimsEnergy(D, n).double(), x, y, 100.0 / N, bias_reg=1e-4, tol=1e-3,
                    continuation=False)
    by_stages, at_once = staged.fit(5000), direct.fit(5000)
    assert bool(by_stages.converged.all()) and bool(at_once.converged.all()) and staged.stage < 1e-2
    assert staged.epochs * 5 < direct.epochs
    assert float(by_stages.primal) == pytest.approx(float(at_once.primal), rel=2e-3)


def test_a_resumed_fit_resumes_the_continuations_stage():
    x, y = problem(200, 20, 5, seed=1)
    first = DualCD(FinleyJoachimsEnergy(20, 5).double(), x, y, 0.5, bias_reg=1e-4, tol=1e-3)
    while first.stage > 1e-2:
        first.fit(max_epochs=first.epochs + 5)
    again = DualCD(FinleyJoachimsEnergy(20, 5).double(), x, y, 0.5, bias_reg=1e-4, tol=1e-3)
    again.load_state_dict(first.state_dict())
    assert again.stage == first.stage and float(again.last.primal) == float(first.certify().primal)
    assert float(again.stage_gap.gap) == float(first.stage_gap.gap)


def test_independent_trains_with_dcd_by_default_to_its_certificate_in_one_epoch():
    from structtorch.data.datamodule import SyntheticDataModule

    dm = SyntheticDataModule(num_train=300, num_test=200, num_labels=5, val_fraction=0.0, seed=1)
    model = Independent(dm.num_features, dm.num_labels)  # solver="auto"
    trainer = L.Trainer(max_epochs=20, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(model, datamodule=dm)
    report = model.solver_report()
    assert model.solver_name == "dcd" and model.bias_reg == 1e-4  # the other learners' rho, by continuation
    assert Independent(3, 2, margin="zero_one").solver_name != "dcd"  # not Independent's Hamming hinge
    assert report["solver"] == "dcd" and report["converged"] and trainer.current_epoch == 1  # one epoch
    acc = trainer.test(model, datamodule=dm, verbose=False)[0]["test/hamming_acc"]
    assert acc > 0.8  # a model that learned nothing predicts the majority state: about 0.6 here


def test_bad_input_gets_a_clear_error():
    x, y = problem(10, 3, 3, seed=0)
    chain = FinleyJoachimsEnergy(3, 3, graph=Graph.chain(3)).double()
    with pytest.raises(ValueError, match="without edges"):
        DualCD(chain, x, y, 0.1)
    with pytest.raises(ValueError, match="bias_reg must be > 0"):
        DualCD(FinleyJoachimsEnergy(3, 3).double(), x, y, 0.1, bias_reg=0.0)
    with pytest.raises(ValueError, match="same rows"):
        DualCD(FinleyJoachimsEnergy(3, 3).double(), x, y[:5], 0.1)
    with pytest.raises(ValueError, match="lam must be finite and > 0"):
        DualCD(FinleyJoachimsEnergy(3, 3).double(), x, y, 0.0)
    tree = FixedTree(3, 3, tree="chain", solver="dcd")
    tree.resolve_l2(10)
    with pytest.raises(ValueError, match="solver=dcd solves one linear SVM per label"):
        tree.strategy.check()


def sparse_problem(N: int, D: int, n: int, seed: int, density: float = 0.08) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised sparse binary features (each column's zeros become one nonzero value, its most frequent) and a
    bias input: rows that are sparse up to a constant row (``SparseRows``)."""
    g = torch.Generator().manual_seed(seed)
    raw = (torch.rand(N, D, generator=g, dtype=torch.float64) < density).double()
    y = (raw @ torch.randn(D, n, generator=g, dtype=torch.float64) + 0.3 * torch.randn(N, n, generator=g,
                                                                                      dtype=torch.float64) > 0.2)
    x = (raw - raw.mean(0)) / raw.std(0).clamp_min(1e-3)
    return torch.cat([x, torch.full((N, 1), 3.0, dtype=torch.float64)], 1), y.long()


@pytest.mark.parametrize("n,D", [(3, 40), (19, 120), (40, 7)])  # one partial block; several with a remainder
def test_sparse_kernel_takes_the_dense_kernels_steps(n, D):
    """``svm_dcd_sparse`` on rows x_i = z_i + c steps as ``svm_dcd`` on x (each label's w = u + beta c, w . x_i from
    z_i's nonzeros), from a nonzero w as a resumed fit has."""
    x, y = sparse_problem(60, D, n, seed=n)
    rows = SparseRows.of(x)
    assert rows is not None and rows.values.numel() < 0.25 * x.numel() and float(rows.c.abs().min()) > 0
    sign = (2.0 * y - 1.0).double().contiguous()
    order = torch.stack([torch.randperm(60, generator=torch.Generator().manual_seed(e)) for e in range(3)])
    start = 0.01 * torch.randn(n, D + 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    alpha, w = torch.zeros(n, 60, dtype=torch.float64), start.clone()
    fused.kernels().svm_dcd_sparse(rows.indptr, rows.indices, rows.values, rows.c, rows.q, sign, order, alpha, w,
                                   0.7)
    ref_alpha, ref_w = torch.zeros_like(alpha), start.clone()
    fused.kernels().svm_dcd(x, sign, order, ref_alpha, ref_w, 0.7)
    assert float(alpha.max()) > 0
    torch.testing.assert_close(alpha, ref_alpha, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(w, ref_w, rtol=1e-9, atol=1e-11)


def test_dualcd_steps_through_the_nonzeros_of_sparse_rows(monkeypatch):
    """Sparse rows (delicious: 3.7% nonzeros beside each column's most frequent value) go by ``svm_dcd_sparse``,
    without a dense copy of the rows, dense ones (yeast: 99.9%) by ``svm_dcd``; both certify the same optimum,
    through the continuation's stages (each changes the bias input, c's last entry) with a gap never negative."""
    x, y = sparse_problem(150, 60, 5, seed=3)
    sparse = DualCD(FinleyJoachimsEnergy(60, 5).double(), x[:, :-1], y, 0.05, bias_reg=1e-2, tol=1e-5)
    assert sparse.rows is not None and sparse.x is None
    assert DualCD(FinleyJoachimsEnergy(60, 5).double(), *problem(150, 60, 5, 3), 0.05).rows is None
    monkeypatch.setattr("structtorch.solvers.dcd.SPARSE_DENSITY", -1.0)  # the same rows, stepped through densely
    dense = DualCD(FinleyJoachimsEnergy(60, 5).double(), x[:, :-1], y, 0.05, bias_reg=1e-2, tol=1e-5)
    assert dense.rows is None and dense.x is not None
    gaps = []
    for solver in (sparse, dense):
        for _ in range(400):
            if bool(solver.fit(max_epochs=solver.epochs + 5).converged.all()):
                break
            gaps.append(float(solver.last.gap))
    assert bool(sparse.last.converged) and bool(dense.last.converged)
    assert sparse.stage == dense.stage == 1e-2 and min(gaps) >= 0.0
    assert float(sparse.last.primal) == pytest.approx(float(dense.last.primal), rel=2e-5)
    torch.testing.assert_close(sparse.w, dense.w, rtol=0, atol=1e-3 * float(dense.w.abs().max()))
    dense.alpha = sparse.alpha.clone()  # the same dual point: the same certificate through z's nonzeros
    same, ours = dense.certify(), sparse.certify()
    torch.testing.assert_close(sparse.w, dense.w, rtol=1e-10, atol=1e-12)
    assert float(ours.primal) == pytest.approx(float(same.primal), rel=1e-10)
    assert float(ours.dual) == pytest.approx(float(same.dual), rel=1e-10)


@pytest.mark.parametrize("block", [7, 100, 2**22])  # row and column blocks of every size, one block
def test_sparse_rows_are_the_same_block_by_block(monkeypatch, block):
    """``SparseRows.of`` reads x in blocks of ``BLOCK_ELEMENTS`` (``inputs.sparse_rows``: no [N, D] temporary beside
    x): the same rows, column values c, nonzeros and norms whatever the block, as z = x - c taken whole."""
    x = sparse_problem(90, 33, 4, seed=5)[0]
    monkeypatch.setattr("structtorch.inputs.BLOCK_ELEMENTS", block)
    monkeypatch.setattr("structtorch.solvers.dcd.BLOCK_ELEMENTS", block)
    rows = SparseRows.of(x)
    c = x.mode(0).values
    z = x - c
    torch.testing.assert_close(rows.c, c, rtol=0, atol=0)
    torch.testing.assert_close(rows.z.to_dense(), z, rtol=0, atol=0)
    torch.testing.assert_close(rows.zt.to_dense(), z.T, rtol=0, atol=0)
    torch.testing.assert_close(rows.values, z[z != 0], rtol=0, atol=0)
    assert torch.equal(rows.indptr, torch.cat([torch.zeros(1, dtype=torch.long), (z != 0).sum(1).cumsum(0)]))
    torch.testing.assert_close(rows.q, x.pow(2).sum(1), rtol=1e-15, atol=0)
