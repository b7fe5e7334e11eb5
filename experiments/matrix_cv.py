"""Every learner with its defaults against Independent on K folds of each training file (the test file unused).

    python experiments/matrix_cv.py [--datasets flags emotions birds] [--models mam tree_crf ...] [--folds 5] [--update]
                                    [--out experiments/results/matrix_cv]

``matrix.md`` scores each learner once, on the dataset's test file, which can decide the comparison with Independent
by a row or two: flags has 65 test rows (a row is 1.5 points of subset accuracy), birds 323. Here each learner runs
with its defaults (the CLI's time budget included) on each fold k of a ``--folds``-fold split of the training file,
trained on the other folds and tested on fold k (``data.num_folds`` / ``data.fold`` / ``data.fold_pool=train``; the
test file is not read). Each row: the mean over folds of the held-out Hamming / subset / example-F1 accuracy (%),
each fold's subset accuracy and example F1, and the mean paired difference to Independent on the same folds with 2
standard errors (over folds). Writes <out>.csv and <out>.md; ``--update`` keeps the rows not rerun.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from matrix import MODELS
from runner import ROOT, run_folds
from tables import SCORES, mean_2se, merge_rows, percents, read_rows, write_table

from structtorch.config import TrainerConfig

PER_FOLD = {"subset_acc": "subset per fold", "example_f1": "F1 per fold"}
DIFFERENCES = {"subset_acc": "subset - independent", "example_f1": "F1 - independent"}
COLUMNS = ["dataset", "model", *SCORES, *DIFFERENCES.values(), *PER_FOLD.values(), "train s"]


def fold_row(data: str, model: str, folds: int) -> dict:
    """``model`` with its defaults on every fold of ``data``'s training file: mean scores (%), each fold's subset
    accuracy and example F1, mean training seconds."""
    runs = run_folds([f"model={model}", "data=mulan", f"data.name={data}", "data.fold_pool=train",
                      f"trainer.time_budget={TrainerConfig.time_budget}"], folds)
    scores = [percents(m, "test/") for m in runs]
    return {"dataset": data, "model": model, **{k: round(sum(s[k] for s in scores) / folds, 2) for k in SCORES},
            **{column: " ".join(f"{s[k]:.2f}" for s in scores) for k, column in PER_FOLD.items()},
            "train s": round(sum(m["train_seconds"] for m in runs) / folds, 1)}


def with_differences(rows: list[dict]) -> list[dict]:
    """``rows`` with each learner's mean paired difference to Independent on the same dataset's folds, "+d ± 2se"
    (points), where Independent's row is there."""
    independent = {r["dataset"]: r for r in rows if r["model"] == "independent"}
    out = []
    for r in rows:
        base = independent.get(r["dataset"])
        cells = {}
        if base is not None and r["model"] != "independent":
            for k, column in DIFFERENCES.items():
                ours, theirs = (str(row[PER_FOLD[k]]).split() for row in (r, base))
                mean, two_se = mean_2se([float(a) - float(b) for a, b in zip(ours, theirs)])
                cells[column] = f"{mean:+.2f} ± {two_se:.2f}" if two_se != "" else f"{mean:+.2f}"
        out.append({**r, **cells})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["flags", "emotions", "birds"])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--update", action="store_true", help="keep the rows of <out>.csv that are not rerun")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/matrix_cv"))
    args = ap.parse_args()
    out = Path(args.out)
    rows = read_rows(out.with_suffix(".csv")) if args.update else []
    for data in args.datasets:
        for model in args.models:
            rows = merge_rows(rows, [fold_row(data, model, args.folds)], MODELS)
            write_table(with_differences(rows), out, COLUMNS, footer=FOOTER)


FOOTER = ["", "Held-out accuracies in % (Hamming / subset 0-1 / example F1), mean over the folds of each training "
          "file (the test file unused), every learner with its defaults and the CLI's time budget; the differences "
          "to Independent are paired by fold, with 2 standard errors over the folds. Written by "
          "`python experiments/matrix_cv.py` on the 2-core CPU machine."]


if __name__ == "__main__":
    main()
