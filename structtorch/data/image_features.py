"""Local features of colour images on a 4-connected pixel grid, as in Domke's Horses experiment (NIPS 2013, Sec. 8),
computed for a whole batch of equally sized images at once (torch only).

Unary (per pixel, 42): a constant 1, the pixel's RGB (3, in [0, 1]), its vertical and horizontal position (2, in
[0, 1]), and a histogram of oriented gradients (36, ``hog``). Pairwise (per edge of ``Graph.grid(h, w)``, 3): a
constant 1, the l2 distance of the two pixels' RGB vectors, and the Sobel edge response (``sobel``) averaged over the
two pixels. Grey levels are ITU-R 601 luma, 0.299 R + 0.587 G + 0.114 B.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..graph import Graph, check_int

__all__ = ["HOG_BINS", "LUMA", "grey", "hog", "pairwise_features", "sobel", "unary_features"]

#: orientation bins of a HOG cell (unsigned gradients, [0, pi)); a block holds 2 x 2 cells: 4 * 9 = 36 features
HOG_BINS = 9
#: grey = LUMA . RGB (ITU-R 601)
LUMA = (0.299, 0.587, 0.114)
#: L2-Hys block normalisation: v / sqrt(|v|^2 + HOG_EPS^2), clipped at HOG_CLIP, normalised again (Dalal & Triggs)
HOG_EPS, HOG_CLIP = 0.01, 0.2


def _check_rgb(rgb: torch.Tensor) -> None:
    if not isinstance(rgb, torch.Tensor) or rgb.dim() != 4 or rgb.shape[1] != 3 or not rgb.is_floating_point():
        got = f"{rgb.dtype} {tuple(rgb.shape)}" if isinstance(rgb, torch.Tensor) else type(rgb).__name__
        raise ValueError(f"rgb must be a float tensor [N, 3, h, w] (values in [0, 1]), got {got}")


def grey(rgb: torch.Tensor) -> torch.Tensor:
    """Luma of rgb [N, 3, h, w] -> [N, h, w]."""
    _check_rgb(rgb)
    return torch.einsum("nchw,c->nhw", rgb, rgb.new_tensor(LUMA))


def sobel(g: torch.Tensor) -> torch.Tensor:
    """Sobel gradient magnitude of grey images g [N, h, w] -> [N, h, w], divided by 4 (a unit step between two
    regions gives 1). Borders repeat the edge pixel (scipy.ndimage's "reflect" at a 3 x 3 kernel)."""
    smooth, diff = g.new_tensor([1.0, 2.0, 1.0]), g.new_tensor([-1.0, 0.0, 1.0])
    kernels = torch.stack([smooth[:, None] * diff[None, :], diff[:, None] * smooth[None, :]])[:, None]  # d/dx, d/dy
    padded = F.pad(g[:, None], (1, 1, 1, 1), mode="replicate")
    return F.conv2d(padded, kernels).square().sum(1).sqrt() / 4


def _gradient_votes(g: torch.Tensor, bins: int) -> torch.Tensor:
    """Each pixel's gradient magnitude split between the two orientation bins nearest its unsigned orientation
    (linear interpolation between bin centres (k + 1/2) pi / bins, cyclic): g [N, h, w] -> votes [N, bins, h, w].
    Gradients are central differences [-1, 0, 1], borders repeating the edge pixel."""
    p = F.pad(g[:, None], (1, 1, 1, 1), mode="replicate")[:, 0]
    gx, gy = p[:, 1:-1, 2:] - p[:, 1:-1, :-2], p[:, 2:, 1:-1] - p[:, :-2, 1:-1]
    magnitude, theta = torch.hypot(gx, gy), torch.atan2(gy, gx).remainder(math.pi)
    t = theta / (math.pi / bins) - 0.5
    lo = t.floor()
    upper = t - lo  # the share of the next bin
    lo = lo.long().remainder(bins)
    votes = g.new_zeros(g.shape[0], bins, *g.shape[1:])
    votes.scatter_add_(1, lo[:, None], (magnitude * (1 - upper))[:, None])
    votes.scatter_add_(1, (lo[:, None] + 1).remainder(bins), (magnitude * upper)[:, None])
    return votes


def hog(g: torch.Tensor, cell: int, bins: int = HOG_BINS) -> torch.Tensor:
    """Dense histograms of oriented gradients (Dalal & Triggs) of grey images g [N, h, w] -> [N, 4 * bins, h, w].

    Pixel (r, c) gets the block of 2 x 2 cells of ``cell`` x ``cell`` pixels around it, rows [r - cell, r + cell) and
    columns [c - cell, c + cell), cells in the order top-left, top-right, bottom-left, bottom-right: each cell the
    sum of its pixels' orientation votes (``_gradient_votes``; pixels outside the image vote 0), the 4 * bins values
    L2-Hys normalised (``HOG_EPS``, ``HOG_CLIP``).
    """
    cell = check_int(cell, "hog cell", 1, expected="an int >= 1 (pixels of the grid per HOG cell side)")
    votes = F.pad(_gradient_votes(g, bins), (cell, cell, cell, cell))
    h, w = g.shape[1:]
    # box[:, :, i, j] = the votes of padded rows [i, i + cell) and columns [j, j + cell): the cell whose top-left
    # pixel is (i - cell, j - cell) in the image
    box = F.avg_pool2d(votes, cell, stride=1) * cell**2
    blocks = torch.cat([box[:, :, i:i + h, j:j + w] for i in (0, cell) for j in (0, cell)], 1)
    return _l2_hys(blocks)


def _l2_hys(v: torch.Tensor) -> torch.Tensor:
    """L2-Hys normalisation of v [N, D, h, w] over D."""
    v = v / (v.square().sum(1, keepdim=True) + HOG_EPS**2).sqrt()
    v = v.clamp(max=HOG_CLIP)
    return v / (v.square().sum(1, keepdim=True) + HOG_EPS**2).sqrt()


def unary_features(rgb: torch.Tensor, hog_cell: int) -> torch.Tensor:
    """Domke's 42 per-pixel features of rgb [N, 3, h, w] -> [N, h * w, 42] (node r * w + c, as ``Graph.grid``):
    1, R, G, B, r / (h - 1), c / (w - 1), then ``hog(grey(rgb), hog_cell)`` (36)."""
    _check_rgb(rgb)
    N, _, h, w = rgb.shape
    rows = torch.linspace(0, 1, h, dtype=rgb.dtype) if h > 1 else rgb.new_zeros(1)
    cols = torch.linspace(0, 1, w, dtype=rgb.dtype) if w > 1 else rgb.new_zeros(1)
    position = torch.stack(torch.meshgrid(rows, cols, indexing="ij")).to(rgb.device).expand(N, 2, h, w)
    maps = torch.cat([rgb.new_ones(N, 1, h, w), rgb, position, hog(grey(rgb), hog_cell)], 1)
    return maps.flatten(2).transpose(1, 2)


def pairwise_features(rgb: torch.Tensor) -> torch.Tensor:
    """Domke's 3 per-edge features of rgb [N, 3, h, w] -> [N, E, 3] in the edge order of ``Graph.grid(h, w)``: 1, the
    l2 distance of the two pixels' RGB, the mean of their ``sobel`` responses."""
    _check_rgb(rgb)
    N, _, h, w = rgb.shape
    edges = Graph.grid(h, w).edges.to(rgb.device)
    pixels = rgb.flatten(2)  # [N, 3, n]
    edge_sobel = sobel(grey(rgb)).flatten(1)[:, edges].mean(-1)  # [N, E]
    distance = (pixels[:, :, edges[:, 0]] - pixels[:, :, edges[:, 1]]).norm(dim=1)
    return torch.stack([torch.ones_like(distance), distance, edge_sobel], -1)
