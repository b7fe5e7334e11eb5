"""Independent (Empty), FixedTree (Chow-Liu) and Full on the Mulan standard splits, CRANK Table 1 protocol.

    python experiments/baselines_mulan.py [--datasets scene emotions yeast] [--models independent fixed_tree full]

For every dataset and model, l2 is chosen from a grid by Hamming accuracy on the validation split
(10% of the training file, seeded); the test file is only used to report the chosen model.
Runs the same code path as the CLI (``structtorch.train.run`` on composed Hydra configs).
Writes experiments/results/baselines_mulan.{md,csv}.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from structtorch.train import run

ROOT = Path(__file__).resolve().parents[1]
PAPER = {  # CRANK Table 1: Hamming / 0-1 / example F1 (%)
    "Empty": {"scene": (89.3, 49.5, 56.5), "emotions": (76.7, 20.3, 48.5), "yeast": (79.8, 12.1, 58.0)},
    "Full": {"scene": (90.7, 62.2, 67.8), "emotions": (79.0, 33.7, 62.5), "yeast": (80.2, 19.0, 60.9)},
}
L2_GRID = [0.01, 0.03, 0.1, 0.3, 1.0]


def run_one(model: str, data: str, l2: float, out: Path) -> dict:
    overrides = [f"model={model}", f"data={data}", f"model.l2={l2}", "logger=none",
                 "trainer.enable_progress_bar=false", "trainer.enable_checkpointing=false"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return run(cfg, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["scene", "emotions", "yeast"])
    ap.add_argument("--models", nargs="+", default=["independent", "fixed_tree", "full"])
    ap.add_argument("--out", default=str(ROOT / "experiments/results/baselines_mulan"))
    args = ap.parse_args()
    rows = []
    for data in args.datasets:
        for model in args.models:
            best = None
            for l2 in L2_GRID:
                with tempfile.TemporaryDirectory() as tmp:
                    m = run_one(model, data, l2, Path(tmp))
                val = m.get("val/hamming_acc", float("nan"))
                test = m["test/hamming_acc"]
                print(f"{data:9s} {model:12s} l2={l2:<5} val hamming {val:.4f} test hamming {test:.4f}")
                if best is None or val > best[0]:
                    best = (val, l2, m)
            val, l2, m = best
            rows.append({"dataset": data, "model": model, "l2 (by val)": l2, "val hamming": round(100 * val, 2),
                         **{k: round(100 * m[f"test/{k}"], 2) for k in ("hamming_acc", "subset_acc", "example_f1")},
                         "train s": round(m["train_seconds"], 1)})
    write(rows, Path(args.out))


def write(rows: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["| dataset | model | l2 (val) | test Hamming | test 0/1 | test ex. F1 | paper Empty H / 0-1 / F1 "
             "| paper Full H / 0-1 / F1 | train s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        empty, full = (" / ".join(map(str, PAPER[p].get(r["dataset"], ()))) for p in ("Empty", "Full"))
        lines.append(f"| {r['dataset']} | {r['model']} | {r['l2 (by val)']} | {r['hamming_acc']} | {r['subset_acc']} | "
                     f"{r['example_f1']} | {empty} | {full} | {r['train s']} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
