"""Rows sparse up to a constant row (``inputs.SparseInputs``): products through the nonzeros, the linear energies
on them, and the certified L-BFGS solver storing its training rows so."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structtorch import inputs
from structtorch.energies import FinleyJoachimsEnergy, LocalLinearEnergy
from structtorch.estimation import select_inputs
from structtorch.graph import Graph
from structtorch.inputs import SparseInputs
from structtorch.solvers import SmoothedLBFGS
from structtorch.structure import random_spanning_trees

SETTINGS = dict(deadline=None, max_examples=20, suppress_health_check=[HealthCheck.too_slow])
F64 = torch.float64


def standardised_sparse(N: int, D: int, density: float, seed: int) -> torch.Tensor:
    """Binary rows at ``density`` standardised per column (float64 [N, D]): dense, each column's zeros one value."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(N, D, generator=g) < density).to(F64)
    x[0, 0] = 1.0  # at least one nonzero
    return (x - x.mean(0)) / x.std(0, correction=0).clamp(min=1e-3)


def random_tree(n: int, seed: int) -> Graph:
    return Graph(n, random_spanning_trees(n, 1, torch.Generator().manual_seed(seed)).edges[0])


@settings(**SETTINGS)
@given(st.integers(1, 30), st.integers(1, 25), st.integers(0, 4), st.integers(0, 2**31 - 1),
       st.integers(0, 30), st.integers(0, 30))
def test_products_through_the_nonzeros_equal_the_dense_rows(N, D, models, seed, a, b):
    """x[a:b] w^T and its gradient in w through z = x - c's nonzeros equal the dense rows', for a weight [out, D] or
    a batch of them [M, out, D], on any row slice (empty ones too)."""
    x = standardised_sparse(N, D, 0.04, seed)
    rows = SparseInputs(*inputs.sparse_rows(x, 1.0))
    g = torch.Generator().manual_seed(seed + 1)
    shape = (3, D) if models == 0 else (models, 3, D)
    w = torch.randn(*shape, dtype=F64, generator=g, requires_grad=True)
    got = rows[a:b].linear(w)
    want = x[a:b] @ w.transpose(-1, -2)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad = torch.randn(want.shape, dtype=F64, generator=g)
    torch.testing.assert_close(torch.autograd.grad(got, w, grad)[0], torch.autograd.grad(want, w, grad)[0],
                               rtol=1e-12, atol=1e-12)
    assert rows[a:b].shape == x[a:b].shape and len(rows[a:b]) == len(x[a:b])


@settings(**SETTINGS)
@given(st.integers(1, 30), st.integers(1, 12), st.integers(0, 5), st.integers(1, 4), st.integers(1, 3),
       st.integers(0, 2**31 - 1), st.integers(0, 30), st.integers(0, 30))
def test_gathered_columns_through_the_nonzeros_equal_the_dense_rows(N, D, R, P, out, seed, a, b):
    """``gathered_linear``: sum_p w[o, r, p] x[b, columns[r, p]] and its gradient in w through z = x - c's gathered
    nonzeros equal the dense rows' on any row slice, with padded slots (-1) and columns shared by factors; a slice
    and its columns are gathered once."""
    x = standardised_sparse(N, D, 0.1, seed)
    rows = SparseInputs(*inputs.sparse_rows(x, 1.0))[a:b]
    g = torch.Generator().manual_seed(seed + 1)
    columns = torch.randint(-1, D, (R, P), generator=g)
    w = torch.randn(out, R, P, dtype=F64, generator=g, requires_grad=True)
    got = rows.gathered_linear(columns, w)
    dense = x[a:b][:, columns.clamp(min=0)] * (columns >= 0)  # [B, R, P]
    want = torch.einsum("brp,orp->bro", dense, w)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad = torch.randn(want.shape, dtype=F64, generator=g)
    torch.testing.assert_close(torch.autograd.grad(got, w, grad)[0], torch.autograd.grad(want, w, grad)[0],
                               rtol=1e-12, atol=1e-12)
    assert rows.gathered(columns)[0] is rows.gathered(columns.clone())[0]


@pytest.mark.parametrize("models", [None, 2])
def test_sparse_product_gradcheck(models):
    rows = SparseInputs(*inputs.sparse_rows(standardised_sparse(12, 9, 0.15, 3), 1.0))
    shape = (4, 9) if models is None else (models, 4, 9)
    w = torch.randn(*shape, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: rows[2:10].linear(w), (w,))


def test_rows_are_kept_sparse_only_below_the_density():
    """``SparseInputs.of``: None where z holds more than ``SPARSE_PRODUCT_DENSITY`` nonzeros; a row slice's CSR
    tensors are made once and shared with the rows it was sliced from."""
    sparse, dense = standardised_sparse(200, 30, 0.02, 0), standardised_sparse(200, 30, 0.5, 0)
    assert SparseInputs.of(dense) is None
    rows = SparseInputs.of(sparse)
    assert rows is not None
    assert rows[5:50].tensors()[0] is rows[5:50].tensors()[0]


def test_a_row_index_that_is_not_a_slice_is_refused():
    rows = SparseInputs(*inputs.sparse_rows(standardised_sparse(20, 10, 0.05, 0), 1.0))
    with pytest.raises(TypeError, match="row slices"):
        rows[torch.tensor([0, 3])]
    with pytest.raises(TypeError, match="row slices"):
        rows[::2]


@pytest.mark.parametrize("models", [None, 3])
@pytest.mark.parametrize("local_unary", [False, True])
def test_energies_store_sparse_rows_and_score_them_as_the_dense(monkeypatch, models, local_unary):
    """FinleyJoachims' and LocalLinear's ``stored_inputs`` keep sparse rows as ``SparseInputs`` (LocalLinear with
    unary factors on all inputs only) and score any row slice of them as the dense rows, with the same gradients."""
    monkeypatch.setattr(inputs, "SPARSE_PRODUCT_DENSITY", 1.0)
    x, n = standardised_sparse(40, 30, 0.03, 1), 6
    tree = random_tree(n, 0)
    local = LocalLinearEnergy(30, n, 3, 2, tree, local_unary=local_unary, num_models=models).to(F64)
    local.set_inputs([[i, i + 6, 20 + i] for i in range(n)])
    fixed = FinleyJoachimsEnergy(30, n, tree, num_models=models, spin=True).to(F64)
    for energy in (local, fixed):
        with torch.no_grad():
            for p in energy.parameters():
                p.normal_(generator=torch.Generator().manual_seed(2))
        stored = energy.stored_inputs(x)
        if energy is local and local_unary:
            assert torch.is_tensor(stored) and stored.T.is_contiguous()
            continue
        assert isinstance(stored, SparseInputs) and energy.stored_inputs(stored) is stored
        got, want = energy(stored[7:31]), energy(x[7:31])
        torch.testing.assert_close(got.unary, want.unary, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got.pairwise, want.pairwise, rtol=1e-12, atol=1e-12)
        g = torch.Generator().manual_seed(3)
        cotangent = [torch.randn(t.shape, dtype=F64, generator=g) for t in (want.unary, want.pairwise)]
        params = list(energy.parameters())
        for a, b in zip(torch.autograd.grad((got.unary, got.pairwise), params, cotangent),
                        torch.autograd.grad((want.unary, want.pairwise), params, cotangent)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("crf", [False, True])
def test_certified_lbfgs_on_sparse_rows_reaches_the_dense_rows_optimum(monkeypatch, crf):
    """SmoothedLBFGS stores sparse rows as ``SparseInputs``: certified to its tolerance, with the same objective
    as on the dense rows (``SPARSE_PRODUCT_DENSITY`` 0), and a gap that is never negative."""
    x, n = standardised_sparse(120, 40, 0.04, 4), 5
    g = torch.Generator().manual_seed(5)
    y = (x[:, :n] + 0.5 * torch.randn(120, n, dtype=F64, generator=g) > 0).long()
    tree = random_tree(n, 1)
    results = {}
    for side in ("dense", "sparse"):
        monkeypatch.setattr(inputs, "SPARSE_PRODUCT_DENSITY", 0.0 if side == "dense" else 1.0)
        energy = (LocalLinearEnergy(40, n, 3, 2, tree) if crf else FinleyJoachimsEnergy(40, n, tree, spin=True))
        if crf:
            energy.set_inputs([[i, i + 5, i + 10] for i in range(n)])
        solver = SmoothedLBFGS(energy, x, y, 0.01, margin_scale=0.0 if crf else 1.0, eps=1.0 if crf else None,
                               tol=1e-4)
        assert isinstance(solver.x, SparseInputs) == (side == "sparse")
        info = solver.fit(max_iter=2000)
        assert bool(info.converged.all()) and float(info.gap.min()) >= 0.0
        results[side] = float(info.primal)
    assert results["sparse"] == pytest.approx(results["dense"], rel=2e-4)  # both within 1e-4 of the optimum


def test_l1_input_selection_through_the_nonzeros_chooses_the_dense_rows_inputs(monkeypatch):
    """``select_inputs`` (TreeCRF's input mapping by l1 logistic regressions) steps through the standardised rows'
    nonzeros where they are sparse, and ranks the same columns as on the dense rows."""
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(300, 400, generator=g) < 0.02).float()
    y = ((x @ torch.randn(400, 6, generator=g)) > 0.5).long()
    sparse = select_inputs(x, y, 4)
    monkeypatch.setattr(inputs, "SPARSE_PRODUCT_DENSITY", 0.0)
    assert select_inputs(x, y, 4) == sparse
