"""Pictures of what a learner learned: its label structure and its per-label test metrics (matplotlib, Agg).

``structure_figure`` draws a tree / forest as a graph with labels by name and edges weighted (width =
|weight|, colour = sign), and a loopy graph (or an ensemble's edge frequencies) as an n x n heatmap.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .graph import Graph  # noqa: E402

__all__ = ["close_figure", "grid_functions_figure", "grid_predictions_figure", "heatmap_figure", "per_label_figure",
           "pixel_accuracy_figure", "structure_figure"]


def structure_figure(graph: Graph, weights: torch.Tensor | None, label_names: list[str], title: str = "") -> Figure:
    """The label graph: a drawing for forests, an n x n weight heatmap otherwise.

    graph: single graph on n labels; weights: [E] per-edge weight (None: all 1); label_names: [n].
    """
    n = graph.num_nodes
    if len(label_names) != n:
        raise ValueError(f"label_names must have {n} entries, got {len(label_names)}")
    edges = graph.edges.reshape(-1, 2)
    w = torch.ones(len(edges)) if weights is None else torch.as_tensor(weights, dtype=torch.float32).reshape(-1)
    if len(w) != len(edges):
        raise ValueError(f"weights must have one entry per edge ({len(edges)}), got {len(w)}")
    if graph.is_forest:
        return _forest_figure(edges, w, label_names, title)
    matrix = torch.zeros(n, n)
    matrix[edges[:, 0], edges[:, 1]] = w
    matrix[edges[:, 1], edges[:, 0]] = w
    return heatmap_figure(matrix, label_names, title, "pairwise weight")


def heatmap_figure(matrix: torch.Tensor, label_names: list[str], title: str, colorbar: str) -> Figure:
    """A symmetric label x label matrix [n, n] (pairwise weights, ensemble edge frequencies)."""
    n = len(label_names)
    size = min(14.0, 2.0 + 0.45 * n)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    bound = float(matrix.abs().max()) or 1.0
    signed = bool((matrix < 0).any())
    im = ax.imshow(matrix.numpy(), cmap="RdBu_r" if signed else "viridis", vmin=-bound if signed else 0, vmax=bound)
    ticks = range(n) if n <= 60 else []
    ax.set_xticks(list(ticks), [label_names[i] for i in ticks], rotation=90, fontsize=8)
    ax.set_yticks(list(ticks), [label_names[i] for i in ticks], fontsize=8)
    fig.colorbar(im, ax=ax, label=colorbar)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def _tree_layout(n: int, edges: list[list[int]]) -> list[tuple[float, float]]:
    """Layered layout of a forest: each tree hangs from its highest-degree node, leaves spread evenly."""
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)
    pos: list[tuple[float, float]] = [(0.0, 0.0)] * n
    seen = [False] * n
    slot = [0.0]

    def place(v: int, depth: int) -> float:  # returns x; leaves take consecutive slots
        seen[v] = True
        kids = [u for u in sorted(adj[v], key=lambda u: -len(adj[u])) if not seen[u]]
        xs = [place(u, depth + 1) for u in kids if not seen[u]]
        x = sum(xs) / len(xs) if xs else slot[0]
        if not xs:
            slot[0] += 1.0
        pos[v] = (x, -float(depth))
        return x

    for root in sorted(range(n), key=lambda v: -len(adj[v])):
        if not seen[root]:
            place(root, 0)
            slot[0] += 0.5
    width = max(max(x for x, _ in pos), 1.0)
    depth = max(max(-y for _, y in pos), 1.0)
    return [(2 * x / width - 1, 2 * y / depth + 1) for x, y in pos]


def _forest_figure(edges: torch.Tensor, w: torch.Tensor, names: list[str], title: str) -> Figure:
    n = len(names)
    xy = _tree_layout(n, edges.tolist())
    fig, ax = plt.subplots(figsize=(min(16.0, 4.0 + 0.6 * n), 6))
    top = float(w.abs().max()) if len(w) else 1.0
    for (a, b), v in zip(edges.tolist(), w.tolist()):
        width = 0.8 + 5.0 * abs(v) / (top or 1.0)
        ax.plot([xy[a][0], xy[b][0]], [xy[a][1], xy[b][1]], color="tab:red" if v >= 0 else "tab:blue",
                linewidth=width, alpha=0.8, zorder=1)
        mx, my = (xy[a][0] + xy[b][0]) / 2, (xy[a][1] + xy[b][1]) / 2
        ax.text(mx, my, f"{v:+.2f}", fontsize=7, ha="center", va="center", zorder=3,
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.7})
    for (x, y), name in zip(xy, names):
        ax.text(x, y, name, fontsize=9, ha="center", va="center", zorder=4,
                bbox={"boxstyle": "round,pad=0.3", "fc": "lightyellow", "ec": "black"})
    ax.set_xlim(-1.25, 1.25)
    ax.set_ylim(-1.25, 1.25)
    ax.axis("off")
    ax.set_title(title or f"{len(edges)} edges (width = |weight|, red > 0, blue < 0)")
    fig.tight_layout()
    return fig


def per_label_figure(per_label: dict[str, torch.Tensor], label_names: list[str], title: str = "") -> Figure:
    """Bars of per-label accuracy and F1 (``PerLabelCounts.compute()``), labels by name."""
    n = len(label_names)
    fig, ax = plt.subplots(figsize=(min(16.0, 3.0 + 0.5 * n), 4))
    x = torch.arange(n).float()
    ax.bar((x - 0.2).tolist(), per_label["accuracy"].tolist(), width=0.4, label="accuracy")
    ax.bar((x + 0.2).tolist(), per_label["f1"].tolist(), width=0.4, label="F1")
    ax.set_xticks(x.tolist(), label_names if n <= 60 else [""] * n, rotation=60, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    ax.set_title(title or "per-label test metrics")
    fig.tight_layout()
    return fig


def grid_predictions_figure(inputs: torch.Tensor, y: torch.Tensor, y_hat: torch.Tensor, height: int, width: int,
                            title: str = "") -> Figure:
    """Rows of images: the input, the true labels, the prediction (with its pixel error and figure IoU).

    inputs [M, n] (grey) or [M, n, 3] (RGB), values in [0, 1]; y / y_hat [M, n] in {0, 1}; n = height * width.
    """
    pictures = inputs.float().reshape(len(inputs), height, width, -1).clamp(0, 1)
    rows = [("input", pictures), ("true labels", y), ("prediction", y_hat)]
    m = len(y)
    fig, axes = plt.subplots(3, m, figsize=(2.2 * m * max(1.0, width / height), 6.6), squeeze=False)
    for r, (name, images) in enumerate(rows):
        for c in range(m):
            ax = axes[r][c]
            image = images[c].float().reshape(height, width, -1)
            ax.imshow(image[..., 0].numpy() if image.shape[-1] == 1 else image.numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(name)
    for c in range(m):
        wrong, union = (y_hat[c] != y[c]).sum(), ((y_hat[c] == 1) | (y[c] == 1)).sum()
        iou = f", IoU {float(((y_hat[c] == 1) & (y[c] == 1)).sum() / union):.2f}" if union else ""
        axes[2][c].set_xlabel(f"error {float(wrong / y[c].numel()):.3f}{iou}")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def pixel_accuracy_figure(accuracy: torch.Tensor, height: int, width: int, title: str = "") -> Figure:
    """Per-pixel accuracy [n] (n = h * w) as an h x w image."""
    fig, ax = plt.subplots(figsize=(5, 4.5))
    im = ax.imshow(accuracy.float().reshape(height, width).numpy(), cmap="viridis", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, label="accuracy")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def grid_functions_figure(energy, title: str = "", points: int = 101) -> Figure:
    """A grid energy's unary and pairwise scores (``energy.unary_fn`` / ``pairwise_fn``, ``num_states`` K)
    against the first feature on [0, 1], the other features at 1 (Domke's features: one value + a constant)."""
    K = energy.num_states
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    t = torch.linspace(0, 1, points)
    for ax, fn, name in ((axes[0], energy.unary_fn, "unary"), (axes[1], energy.pairwise_fn, "pairwise")):
        x = torch.ones(points, fn.in_features)
        x[:, 0] = t
        with torch.no_grad():
            p = next(fn.parameters(), None)
            scores = energy.scale * fn(x.to(p.device if p is not None else "cpu")).float().cpu()
        for s in range(scores.shape[1]):
            label = f"y={s}" if name == "unary" else f"(y_i, y_j)=({s // K}, {s % K})"
            ax.plot(t.tolist(), scores[:, s].tolist(), label=label)
        ax.set_xlabel(f"{name} feature")
        ax.set_ylabel("energy")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def close_figure(fig: Figure) -> None:
    """Release a figure made here (pyplot keeps every open figure alive)."""
    plt.close(fig)
