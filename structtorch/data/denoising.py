"""Domke's synthetic binary denoising images (NIPS 2013, Sec. 8): per-pixel labels on a 4-connected grid.

Per image: pixels ~ U[0, 1], convolved with a Gaussian of std ``blur`` (10) and rounded to {0, 1}: the labels
y. Unary feature of pixel i: U[0, .9] if y_i = 0 else U[.1, 1]; pairwise feature of an edge (i, j) of
``Graph.grid(h, w)``: U[0, .8] if y_i = y_j else U[.2, 1]. A constant feature 1 is appended to both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.ndimage import gaussian_filter

from ..graph import Graph, check_float, check_int

__all__ = ["DenoisingImages", "denoising_images"]


@dataclass
class DenoisingImages:
    """N images of h x w pixels (n = h * w nodes, E grid edges).

    unary: [N, n, 2] float32 (noisy pixel, 1); pairwise: [N, E, 2] float32 (edge feature, 1);
    y: [N, n] int64 in {0, 1}; graph: ``Graph.grid(height, width)`` (node r * w + c).
    """

    unary: torch.Tensor
    pairwise: torch.Tensor
    y: torch.Tensor
    height: int
    width: int
    graph: Graph


def denoising_images(num_images: int, height: int = 100, width: int = 100, blur: float = 10.0,
                     generator: torch.Generator | None = None) -> DenoisingImages:
    """Draw ``num_images`` denoising images (labels, unary and pairwise features) as in Domke's Sec. 8.

    num_images, height, width: ints >= 1; blur: std of the Gaussian (pixels) > 0. Boundaries are
    reflected (scipy's ``gaussian_filter`` default). Deterministic given ``generator``'s state.
    """
    num_images = check_int(num_images, "num_images", 1)
    height, width = check_int(height, "height", 1), check_int(width, "width", 1)
    check_float(blur, "blur", 0.0, expected="a number > 0 (the Gaussian's std in pixels)")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    graph = Graph.grid(height, width)
    noise = torch.rand(num_images, height, width, generator=gen, dtype=torch.float64).numpy()
    smooth = np.stack([gaussian_filter(img, sigma=float(blur)) for img in noise])  # per image, once at load
    # rounding a blurred U[0,1] image: threshold at its mean .5 (ties -> 0)
    y = torch.from_numpy(smooth > 0.5).reshape(num_images, height * width).long()
    yf = y.float()
    unary = torch.rand(y.shape, generator=gen) * 0.9 + 0.1 * yf  # U[0,.9] if y=0 else U[.1,1]
    same = (y[:, graph.edges[:, 0]] == y[:, graph.edges[:, 1]]).float()
    pair = torch.rand(same.shape, generator=gen) * 0.8 + 0.2 * (1.0 - same)  # U[0,.8] if equal else U[.2,1]
    ones_u, ones_p = torch.ones_like(unary), torch.ones_like(pair)
    return DenoisingImages(torch.stack([unary, ones_u], -1), torch.stack([pair, ones_p], -1), y, height, width,
                           graph)
