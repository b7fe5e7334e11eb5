"""Result tables of the experiments (their one writer): one list of row dicts -> <out>.csv and a markdown <out>.md,
markdown tables for footers, the cells the tables share (accuracies in %, CV curves); per-group means with 2 standard
errors, and their curves as a PNG."""

from __future__ import annotations

import csv
import math
from pathlib import Path

PROVENANCE = "<!-- provenance: kept when the table is rewritten -->"


def kept_provenance(md: Path) -> list[str]:
    """The hand-written lines of an existing ``md`` from its ``PROVENANCE`` marker on (which runs made which rows),
    or none: a rerun that rewrites the table (``--update``) keeps them, to be added to."""
    if not md.is_file():
        return []
    text = md.read_text()
    return ["", *text[text.index(PROVENANCE):].rstrip("\n").splitlines()] if PROVENANCE in text else []


def write_table(rows: list[dict], out: Path, columns: list[str] | None = None, footer: list[str] = ()) -> None:
    """Write ``rows`` to ``out``.csv (every key) and ``out``.md (``columns``, default every key, then
    ``footer`` lines, then the existing md's provenance section, ``kept_provenance``), and print the markdown."""
    out.parent.mkdir(parents=True, exist_ok=True)
    footer = [*footer, *kept_provenance(out.with_suffix(".md"))]
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
        w.writeheader()
        w.writerows(rows)
    keys = columns or list(rows[0])
    text = "\n".join([*markdown(keys, [[r.get(k, "") for k in keys] for r in rows]), *footer]) + "\n"
    out.with_suffix(".md").write_text(text)
    print(text)


def markdown(header: list[str], rows: list[list]) -> list[str]:
    """The lines of a markdown table: ``header``, then one line per row of cells (``str`` of each)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


SCORES = ("hamming_acc", "subset_acc", "example_f1")  # the accuracies of the tables, in %


def percents(metrics: dict, prefix: str = "") -> dict[str, float]:
    """``SCORES`` of a metrics dict (keys ``prefix + score``, values in [0, 1]) in %, rounded to 2 decimals."""
    return {k: round(100 * metrics[prefix + k], 2) for k in SCORES}


def curve(values: list[float], scores: list[float]) -> str:
    """A CV curve as one cell: "value:score ..." (scores with 2 decimals)."""
    return " ".join(f"{v:g}:{s:.2f}" for v, s in zip(values, scores))


def read_rows(path: Path) -> list[dict]:
    """The rows of a CSV written by ``write_table`` (none if there is no such file): cells that an int or a float
    prints back unchanged as numbers, the others as written (so a rewritten table keeps its formatting)."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [{k: _number(v) for k, v in r.items()} for r in csv.DictReader(f)]


def _number(cell: str) -> int | float | str:
    for kind in (int, float):
        try:
            if str(kind(cell)) == cell:
                return kind(cell)
        except ValueError:
            pass
    return cell


def merge_rows(kept: list[dict], new: list[dict], order: list[str]) -> list[dict]:
    """``kept`` rows with those of the same (dataset, model) replaced by ``new``; datasets in order of first
    appearance, models in ``order`` (others after it, in order of appearance)."""
    merged = {(r["dataset"], r["model"]): r for r in kept}
    merged.update({(r["dataset"], r["model"]): r for r in new})
    datasets = list(dict.fromkeys(r["dataset"] for r in [*kept, *new]))
    rank = {m: i for i, m in enumerate(dict.fromkeys([*order, *(r["model"] for r in merged.values())]))}
    return sorted(merged.values(), key=lambda r: (datasets.index(r["dataset"]), rank[r["model"]]))


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and standard deviation (ddof 1; 0 for a single value) of ``values``."""
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in values) / max(len(values) - 1, 1))


def mean_2se(values: list[float]) -> tuple[float | str, float | str]:
    """Mean and 2 standard errors (ddof 1) of ``values``; "" where there are no values / fewer than two."""
    v = [float(x) for x in values if x != "" and not math.isnan(float(x))]
    if not v:
        return "", ""
    mean, sd = mean_sd(v)
    return round(mean, 4), round(2 * sd / math.sqrt(len(v)), 4) if len(v) > 1 else ""


def summarize(rows: list[dict], by: list[str], metrics: list[str]) -> list[dict]:
    """One row per distinct ``by`` tuple (in order of first appearance): ``runs``, and for every metric its
    mean (column ``metric``) and 2 standard errors (column ``metric 2se``) over the group's rows."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, cell in groups.items():
        s = {**dict(zip(by, key)), "runs": len(cell)}
        for m in metrics:
            s[m], s[f"{m} 2se"] = mean_2se([r[m] for r in cell])
        out.append(s)
    return out


def plot_curves(summary: list[dict], x: str, series: str, metrics: dict[str, str], path: Path, title: str,
                xlabel: str, log_y: tuple[str, ...] = ()) -> None:
    """One panel per metric (``metrics``: column -> panel title): mean +- 2 SE against ``x`` (log axis), one
    line per value of ``series``; saved as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4.2), squeeze=False)
    names = list(dict.fromkeys(s[series] for s in summary))
    xs = sorted({s[x] for s in summary})
    for ax, (k, panel) in zip(axes[0], metrics.items()):
        for i, name in enumerate(names):
            cell = sorted((s for s in summary if s[series] == name and s[k] != ""), key=lambda s: s[x])
            if cell:
                ax.errorbar([s[x] for s in cell], [s[k] for s in cell], marker="os^vDx<>"[i % 8], capsize=3,
                            yerr=[s[f"{k} 2se"] or 0.0 for s in cell], color=f"C{i % 10}")
        ax.set_xscale("log")
        ax.set_xticks(xs, [str(v) for v in xs])
        ax.minorticks_off()
        if k in log_y:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(panel)
        ax.grid(alpha=0.3)
    fig.legend(handles=[Line2D([], [], color=f"C{i % 10}", marker="os^vDx<>"[i % 8], label=name)
                        for i, name in enumerate(names)], loc="center right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
