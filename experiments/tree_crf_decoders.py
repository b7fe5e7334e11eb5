"""TreeCRF's three decoders on the Mulan standard splits: the joint mode (``tree_map``, subset 0/1), each label's
posterior mode (``tree_mpm``, Hamming) and plug-in expected F1 (``tree_f1``), and the default, ``auto`` (the one the
CV of model.l2 chose on held-out training rows), beside Independent's row of the matrix.

    python experiments/tree_crf_decoders.py [--datasets flags emotions scene yeast birds tmc2007 delicious]
                                            [--work /tmp/tree_crf_decoders] [--update]

One TreeCRF run per dataset with the CLI's defaults (``model=tree_crf data=<dataset>``, its time budget included),
its checkpoint decoded three ways on the test file, and as it predicts (``auto``) (the decoders differ only at
prediction). Writes experiments/results/tree_crf_decoders.{md,csv}.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from runner import ROOT, run_config
from tables import SCORES, merge_rows, percents, read_rows, write_table

from structtorch.config import TrainerConfig
from structtorch.data.datamodule import MultilabelDataModule
from structtorch.learners import TreeCRF
from structtorch.learners.base import TEST_INFERENCE
from structtorch.metrics import multilabel_scores

DATASETS = ["flags", "emotions", "scene", "yeast", "birds", "tmc2007", "delicious"]
DECODERS = ["tree_map", "tree_mpm", "tree_f1", "auto"]
INDEPENDENT = "independent (matrix.md)"
OUT = ROOT / "experiments" / "results" / "tree_crf_decoders"
MATRIX = ROOT / "experiments" / "results" / "matrix.csv"


def decode_rows(data: str, work: Path) -> list[dict]:
    """Train TreeCRF on ``data`` with its defaults (run in ``work``), then one row per decoder on the test file (auto:
    the model's own prediction, with the decoder it chose)."""
    budget = f"trainer.time_budget={TrainerConfig.time_budget}"  # the CLI's default (experiments run unbounded)
    run_config(["model=tree_crf", "data=mulan", f"data.name={data}", budget], out=work)
    model = TreeCRF.load_from_checkpoint(work / "checkpoints" / "last.ckpt", map_location="cpu").eval()
    dm = MultilabelDataModule(name=data)
    dm.setup()
    x, y = dm.test_tensors
    with torch.no_grad():
        pot = model.potentials(x.to(model.dtype))
        predictions = {name: TEST_INFERENCE[name](pot) for name in DECODERS[:-1]} | {"auto": model(x.to(model.dtype))}
    chosen = (model.decoder_choice or {}).get("chosen", "none")
    return [{"dataset": data, "model": f"tree_crf, {name}", **percents(multilabel_scores(y_hat, y)),
             "labels per row": round(float(y_hat.sum(-1).double().mean()), 2), "true labels per row":
             round(float(y.sum(-1).double().mean()), 2), "auto chose": chosen if name == "auto" else ""}
            for name, y_hat in predictions.items()]


def independent_row(data: str) -> dict | None:
    """Independent's committed matrix row on ``data`` (the bar: structured learners >= it minus 1 point)."""
    rows = [r for r in read_rows(MATRIX) if r["dataset"] == data and r["model"] == "independent"]
    if not rows:
        return None
    return {"dataset": data, "model": INDEPENDENT, **{k: rows[0][k] for k in SCORES}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="*", default=DATASETS)
    parser.add_argument("--work", type=Path, default=Path("/tmp/tree_crf_decoders"))
    parser.add_argument("--update", action="store_true", help="keep the committed rows of the other datasets")
    args = parser.parse_args()
    rows = []
    for data in args.datasets:
        rows += decode_rows(data, args.work / data)
        rows += [r for r in [independent_row(data)] if r is not None]
    if args.update and OUT.with_suffix(".csv").exists():
        kept = [r for r in read_rows(OUT.with_suffix(".csv")) if r["dataset"] not in args.datasets]
        rows = merge_rows(kept, rows, [*(f"tree_crf, {d}" for d in DECODERS), INDEPENDENT])
    write_table(rows, OUT, footer=[
        "", "Test accuracies in % (Hamming / subset 0-1 / example F1) of one TreeCRF run per dataset with the CLI's "
        "defaults, decoded three ways: `tree_map` (joint mode: Bayes for subset 0/1), `tree_mpm` (each label's "
        "posterior mode: Bayes for Hamming), `tree_f1` (plug-in expected F1), and as the model predicts by default "
        "(`auto`: on the held-out rows of the CV of model.l2, `tree_mpm` unless another decoder is at least as good "
        "on subset accuracy and on example F1 and better on their sum beyond the CV's noise; `auto chose` names it). "
        "`model.test_inference` chooses. Written by `python experiments/tree_crf_decoders.py`."])


if __name__ == "__main__":
    main()
