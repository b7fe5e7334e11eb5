"""Inputs: per-node and per-edge features of grid images (inputs that are not a flat feature matrix), the
per-feature standardisation of a feature matrix (the datamodules' and the tree-CRF conditionals'), and rows that
are sparse up to a constant row (a standardised sparse feature matrix), multiplied through their nonzeros."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

__all__ = ["BLOCK_ELEMENTS", "SPARSE_PRODUCT_DENSITY", "GridInputs", "SparseInputs", "Standardizer", "csr",
           "csr_transpose", "linear_tables", "sparse_rows"]


@dataclass
class GridInputs:
    """A batch of B images as local features on their grid graph (n nodes, E edges).

    unary: [B, n, Du] per-pixel features; pairwise: [B, E, Dp] per-edge features (edge order of the
    learner's graph, e.g. ``Graph.grid(h, w)``). Behaves like a batch tensor where the learners need
    one: ``len``, ``.to(device / dtype)``, indexing along B.
    """

    unary: torch.Tensor
    pairwise: torch.Tensor

    def __post_init__(self) -> None:
        u, p = self.unary, self.pairwise
        if not isinstance(u, torch.Tensor) or not isinstance(p, torch.Tensor):
            raise TypeError(f"GridInputs needs tensors, got {type(u).__name__} and {type(p).__name__}")
        if u.dim() != 3 or p.dim() != 3 or u.shape[0] != p.shape[0]:
            raise ValueError(f"GridInputs: unary must be [B, n, Du] and pairwise [B, E, Dp] with the same B, got "
                             f"{tuple(u.shape)} and {tuple(p.shape)}")
        if not (u.dtype.is_floating_point and p.dtype.is_floating_point):
            raise TypeError(f"GridInputs: features must be floating point, got {u.dtype} and {p.dtype}")

    def __len__(self) -> int:
        return int(self.unary.shape[0])

    def __getitem__(self, index) -> GridInputs:
        return GridInputs(self.unary[index], self.pairwise[index])

    def to(self, *args, **kwargs) -> GridInputs:
        """Both feature tensors ``.to(*args, **kwargs)`` (device and / or dtype)."""
        return GridInputs(self.unary.to(*args, **kwargs), self.pairwise.to(*args, **kwargs))

    @property
    def device(self) -> torch.device:
        return self.unary.device

    @property
    def dtype(self) -> torch.dtype:
        return self.unary.dtype


#: ``Standardizer.fit`` computes its float64 statistics over blocks of columns of at most this many entries: at
#: bookmarks' shape (55,349 x 2,150) the whole float64 copy and its temporaries peaked at 2.8 GB beside x
STATS_BLOCK_ELEMENTS = 2**24


@dataclass
class Standardizer:
    """Per-feature affine standardisation ``(x - mean) / std`` fitted on training data only.

    mean, std: [D], in the dtype of the standardised features. Features constant on the training set
    (std < eps) get std = 1, so they map to 0 instead of blowing up. Missing values (NaN) are ignored by
    ``fit`` and imputed with the training mean by ``transform`` / ``impute`` (0 after standardisation).
    """

    mean: torch.Tensor
    std: torch.Tensor

    @classmethod
    def fit(cls, x: torch.Tensor, eps: float = 1e-8, dtype: torch.dtype = torch.float32) -> Standardizer:
        """Statistics of x [N, D] (population std, NaN ignored), computed in float64, kept in ``dtype``."""
        if x.dim() != 2 or x.shape[0] == 0:
            raise ValueError(f"Standardizer.fit needs x of shape [N >= 1, D], got {tuple(x.shape)}")
        width = max(1, STATS_BLOCK_ELEMENTS // x.shape[0])
        means, variances = [], []
        for block in x.split(width, dim=1):  # float64 temporaries of at most STATS_BLOCK_ELEMENTS entries
            block = block.to(torch.float64)
            means.append(torch.nan_to_num(block.nanmean(0), nan=0.0))
            variances.append(torch.nan_to_num((block - means[-1]).square().nanmean(0), nan=1.0))
        mean, std = torch.cat(means), torch.cat(variances).sqrt()
        std = torch.where(std < eps, torch.ones_like(std), std)
        return cls(mean.to(dtype), std.to(dtype))

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """Standardised x [N, D] (in the statistics' dtype); NaN -> 0 (the training mean)."""
        out = x.to(self.mean.dtype, copy=True)  # one [N, D] result, standardised in place
        return out.sub_(self.mean).div_(self.std).nan_to_num_(nan=0.0)

    def impute(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, D] with NaN replaced by the training mean, otherwise unchanged."""
        return torch.where(torch.isnan(x), self.mean.to(x.dtype), x)


#: ``sparse_rows`` reads x in blocks of at most this many entries (rows for z, columns for their modes): 32 MB of
#: float64, no [N, D] temporary beside x (at bookmarks' shape, 55,349 x 2,151, x's column modes and z took 2.3 GB
#: more at once)
BLOCK_ELEMENTS = 2**22
#: the share of nonzeros of z up to which a linear energy's stored training rows are ``SparseInputs``. x w^T and
#: its gradient through z against the dense product (``scripts/bench_sparse_inputs.py``'s products, float32, 2
#: threads, two runs): 2.3-2.9x faster at delicious' 3.7%, 1.5-2.35x at 5%, 0.7-1.3x at 10%, 0.3-0.6x at 20% (on one
#: thread 0.8x at 10%)
SPARSE_PRODUCT_DENSITY = 0.05


def sparse_rows(x: torch.Tensor, max_density: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """x [N, D] as x_i = z_i + c: c [D] each column's most frequent value (0 for a sparse feature; a standardised
    sparse column's is the value its zeros became), z in CSR: indptr [N + 1], indices [nnz] (int64, ascending in
    each row), values [nnz]. None where more than ``max_density`` of z's entries are nonzero. Block by block
    (``BLOCK_ELEMENTS``)."""
    N, D = x.shape
    if not x.numel():
        return None
    width, height = max(1, BLOCK_ELEMENTS // N), max(1, BLOCK_ELEMENTS // D)
    c = torch.cat([x[:, j:j + width].mode(0).values for j in range(0, D, width)])
    starts = range(0, N, height)
    if sum(int((x[i:i + height] != c).sum()) for i in starts) > max_density * x.numel():
        return None
    at, values = [], []
    for i in starts:
        z = x[i:i + height] - c
        nonzero = z.nonzero()  # [nnz of the block, 2], row by row
        values.append(z[nonzero[:, 0], nonzero[:, 1]])
        at.append(nonzero + torch.tensor([i, 0], device=x.device))
    at = torch.cat(at)
    indptr = torch.cat([at.new_zeros(1), torch.bincount(at[:, 0], minlength=N).cumsum(0)])
    # strides (1,) even for one nonzero: a CSR tensor's indices need them, where .contiguous() keeps a view's (2,)
    return indptr, at[:, 1].clone(memory_format=torch.contiguous_format), torch.cat(values), c.contiguous()


def csr(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The sparse CSR tensor of (indptr, indices, values) (torch's "in beta" warning silenced: its products are 4x
    faster than COO's here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        return torch.sparse_csr_tensor(indptr, indices, values, shape, check_invariants=True)


def csr_transpose(z: torch.Tensor) -> torch.Tensor:
    """z^T [D, N] in CSR of a CSR tensor z [N, D] (z's CSC layout read as its transpose's CSR)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        zc = z.to_sparse_csc()
    return csr(zc.ccol_indices(), zc.row_indices(), zc.values(), (z.shape[1], z.shape[0]))


class SparseInputs:
    """Rows x_i = z_i + c [B, D] (``sparse_rows``) that a linear energy multiplies through z's nonzeros
    (``linear``): the training rows a solver stores for its whole fit (``Energy.stored_inputs``) where z is at
    most ``SPARSE_PRODUCT_DENSITY`` nonzero. Behaves like the rows where the solvers need it: ``len``, ``shape``,
    ``dim()``, ``dtype``, ``device``, ``.to(dtype / device)``, and row slices ``x[i:j]``, which share the arrays;
    a slice's CSR tensors of z and z^T are made on its first product and kept for the later ones (a solver reads
    the same chunks of rows at every evaluation), as are those of z's columns gathered per factor (``gathered``).
    """

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, c: torch.Tensor,
                 rows: tuple[int, int] | None = None,
                 cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        self.indptr, self.indices, self.values, self.c = indptr, indices, values, c
        self.rows = (0, len(indptr) - 1) if rows is None else rows
        self._cache = {} if cache is None else cache

    @classmethod
    def of(cls, x: torch.Tensor) -> SparseInputs | None:
        """x [N, D] as ``SparseInputs``, or None where z would hold more than ``SPARSE_PRODUCT_DENSITY`` nonzeros."""
        parts = sparse_rows(x, SPARSE_PRODUCT_DENSITY)
        return None if parts is None else cls(*parts)

    @classmethod
    def stored(cls, x: torch.Tensor | SparseInputs) -> torch.Tensor | SparseInputs:
        """x [N, D] as ``SparseInputs`` where ``of`` keeps it so, else x itself (``SparseInputs`` as they are): what
        a linear energy's ``stored_inputs`` returns."""
        sparse = None if isinstance(x, SparseInputs) else cls.of(x)
        return x if sparse is None else sparse

    def __len__(self) -> int:
        return self.rows[1] - self.rows[0]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self), self.c.shape[0]))

    def dim(self) -> int:
        return 2

    @property
    def dtype(self) -> torch.dtype:
        return self.c.dtype

    @property
    def device(self) -> torch.device:
        return self.c.device

    def __getitem__(self, index: slice) -> SparseInputs:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError(f"SparseInputs take row slices x[i:j] only, got {index!r}")
        start, stop, _ = index.indices(len(self))
        stop = max(start, stop)
        rows = (self.rows[0] + start, self.rows[0] + stop)
        return SparseInputs(self.indptr, self.indices, self.values, self.c, rows, self._cache)

    def to(self, *args, **kwargs) -> SparseInputs:
        """The arrays ``.to(*args, **kwargs)`` (device and / or dtype; the indices keep theirs), the same rows."""
        values, c = self.values.to(*args, **kwargs), self.c.to(*args, **kwargs)
        if values is self.values and c is self.c:
            return self
        device = c.device
        return SparseInputs(self.indptr.to(device), self.indices.to(device), values, c, self.rows)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """z [B, D] and z^T [D, B] of these rows as sparse CSR tensors (made once, ``_cache``)."""
        if self.rows not in self._cache:
            (a, b), D = self.rows, self.c.shape[0]
            lo, hi = int(self.indptr[a]), int(self.indptr[b])
            z = csr(self.indptr[a:b + 1] - lo, self.indices[lo:hi], self.values[lo:hi], (b - a, D))
            self._cache[self.rows] = z, csr_transpose(z)
        return self._cache[self.rows]

    def linear(self, weight: torch.Tensor) -> torch.Tensor:
        """x w^T [(M,) B, out] of weight [(M,) out, D], through z's nonzeros: z w^T + w c (differentiable in w)."""
        z, zt = self.tensors()
        return _SparseLinear.apply(weight, z, zt, self.c)

    def gathered_linear(self, columns: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """sum_p weight[o, r, p] x[b, columns[r, p]] [B, R, O] of weight [O, R, P] (differentiable in it; a slot -1
        of columns [R, P] counts as 0): z's gathered entries (``gathered``) times the weights, plus c's share."""
        g, gt = self.gathered(columns)
        O, (R, P) = weight.shape[0], columns.shape
        out = _SparseLinear.apply(weight.reshape(O, R * P), g, gt, None).view(len(self), R, O)  # c differs by factor
        c = torch.where(columns >= 0, self.c[columns.clamp(min=0)], 0).to(weight)  # [R, P]
        return out + (weight * c).sum(-1).T if bool(c.any()) else out

    def gathered(self, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """G [B R, R P] and G^T [R P, B R] as sparse CSR tensors: z's entries at ``columns`` [R, P] (-1: none) of
        each of these rows, one row of G per (row b, factor r), G[(b, r), (r, p)] = z[b, columns[r, p]] (made
        once per row slice and columns, ``_cache``). G^T's row (r, p) is z^T's row columns[r, p] with each row
        index b moved to b R + r."""
        key = (self.rows, tuple(columns.shape), hash(columns.cpu().numpy().tobytes()))
        if key not in self._cache:
            zt = self.tensors()[1]
            crow, col, val = zt.crow_indices(), zt.col_indices(), zt.values()
            (R, P), flat = columns.shape, columns.reshape(-1).to(crow.device)
            column = flat.clamp(min=0)
            start, stop = crow[column], crow[column + 1]
            length = torch.where(flat >= 0, stop - start, 0)  # [R P] entries of each slot
            ends = length.cumsum(0)
            total = int(ends[-1]) if len(ends) else 0
            slot = torch.repeat_interleave(torch.arange(R * P, device=crow.device), length, output_size=total)
            at = torch.arange(total, device=crow.device) - (ends - length)[slot] + start[slot]  # into z^T's arrays
            gt = csr(torch.cat([ends.new_zeros(1), ends]), col[at] * R + slot // P, val[at], (R * P, len(self) * R))
            self._cache[key] = csr_transpose(gt), gt
        return self._cache[key]


def linear_tables(x: torch.Tensor | SparseInputs, weight: torch.Tensor) -> torch.Tensor:
    """x w [..., B, n, K] of rows x [B, D] (a tensor, or ``SparseInputs``: through their nonzeros, ``linear`` of the
    weights' [..., n K, D] copy) and per-label tables of weights [..., n, D, K]."""
    if not isinstance(x, SparseInputs):
        return torch.einsum("bd,...ndk->...bnk", x, weight)
    *lead, n, D, K = weight.shape
    return x.linear(weight.movedim(-1, -2).reshape(*lead, n * K, D)).unflatten(-1, (n, K))


class _SparseLinear(torch.autograd.Function):
    """x w^T = z w^T + w c for x = z + c, weight [..., out, D] -> [..., B, out]; the gradient in w is
    g^T z + (g^T 1) c^T, through z^T's CSR (z, zt sparse CSR [B, D] and [D, B], c [D] or None: no c term; no
    gradient for them)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, z: torch.Tensor, zt: torch.Tensor, c: torch.Tensor | None
                ) -> torch.Tensor:
        ctx.save_for_backward(zt, c)
        ctx.weight_shape = weight.shape
        w = weight.reshape(math.prod(weight.shape[:-1]), weight.shape[-1])  # [P, D] (D = 0 too)
        out = z @ w.T if c is None else z @ w.T + w @ c  # [B, P]
        return out.view(z.shape[0], *weight.shape[:-1]).movedim(0, -2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        zt, c = ctx.saved_tensors
        g = grad.movedim(-2, 0).reshape(zt.shape[1], math.prod(ctx.weight_shape[:-1]))  # [B, P]
        grad_w = (zt @ g).T if c is None else (zt @ g).T + g.sum(0)[:, None] * c  # [P, D]
        return grad_w.reshape(ctx.weight_shape), None, None, None
