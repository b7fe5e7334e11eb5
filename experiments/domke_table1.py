"""Domke (NIPS 2013) Table 1: univariate test error for unary x pairwise function classes, on the synthetic
denoising images (left half) or the Weizmann horses (right half, ``--dataset horses``).

    python experiments/domke_table1.py [--dataset denoising|horses] [--cells linear/linear mlp/mlp ...] [--iters 150]
        [--size 100] [--fit-epochs 5] [--train 16] [--test 16] [--method logistic|hinge] [--lr 1.0] [--batch-size 1]
        [--height 45 --width 60 --hog-cell 6 --root <folder> --test-fraction 0.3 --val-fraction 0] [--curve-every 10]
        [--device cpu] [--out experiments/results/domke_table1[_horses]] [--table-only]

Each cell trains ``LogisticEnergy`` (Algorithm 1: fit u, 25 message passes, fit v, 25 passes; eps = .1) for
``--iters`` learning iterations (one Lightning epoch each) and records the test error (1 - Hamming accuracy of the
smoothed-LP decode), the training error, the seconds per learning iteration (the mean of Algorithm 1's own
``train/iteration_seconds``: the fits and message passes, without the evaluations of the learning curve) and the
learning curve (train and test error after iterations 1, 2, 3, 5 and every ``--curve-every``-th).

Denoising (the default): ``data=denoising``, 16 train / 16 test images of 100 x 100, seed 0. ``--method hinge``
trains the same energies end to end instead (the baseline: smoothed-LP hinge by Adam through the Danskin
gradient, ``--iters`` epochs of ``--batch-size`` images per step with step ``--lr``; model.lr = .01 on batches of 16
barely moves these energies, whose potentials are eps * f: lr 1 on single images was chosen by the training
objective on 40 x 40 images), shown as a second table.

Horses (``--dataset horses``): ``data=horses`` from the data cache (``structtorch.data.fill_horses_cache``), every
image resized to ``--height`` x ``--width``, Domke's 42 unary and 3 pairwise features (HOG cells of ``--hog-cell``
pixels), a seeded split of ``--test-fraction`` of the 246 images for testing (``--root <folder>``: any folder of
images and masks, as ``data.root``; with ``<folder>/train`` + ``<folder>/test`` the split is the folders'; give it
its own ``--out``). The table also gives each cell's IoU and per-image errors
(``structtorch.metrics.segmentation_scores``); ``<out>_curves.png`` is the paper's Fig. 2 (learning curves) and
``<out>.png`` its Fig. 3 (test images, true masks, predictions). ``--val-fraction f`` holds out a seeded share f of
the *training* images and reports the error on them instead of on the test images:
how the grid size and the HOG cell were chosen (``<out>_selection.md``), without the test images.

Cells run one at a time; each writes ``<out>_cells/<unary>_<pairwise>[_hinge|_<grid>_val].json`` so a long
table can be filled over several calls, and every call rebuilds the tables from all cells present.
Nothing is tuned on the test set: the settings are the paper's where it gives them; where it does not, they
were fixed without test data: 20 hidden units; 5 SGD passes per MLP fit (1 pass lowered the training
objective much more slowly on 50 x 50 images); the horses' grid size and HOG cell by the validation error of
Linear / Linear and MLP / MLP on held-out training images; the number of learning iterations per cell is in
the runs table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning as L
import torch
from runner import ROOT
from tables import markdown, write_table

from structtorch.data import DenoisingDataModule, SegmentationDataModule
from structtorch.energies import FUNCTIONS
from structtorch.learners import LogisticEnergy
from structtorch.metrics import ExampleCounts, segmentation_scores

CLASSES = ("zero", "const", "linear", "boost", "mlp")  # Table 1's rows / columns
PICTURED = (("linear", "linear"), ("boost", "boost"), ("mlp", "mlp"))  # cells whose test predictions the PNG shows
NAMES = {"zero": "Zero", "const": "Const.", "linear": "Linear", "boost": "Boost.", "mlp": "MLP"}
# Table 1 of the paper: PAPER[dataset][unary][pairwise]
PAPER = {"denoising": {"zero": dict(zero=.502, const=.502, linear=.502, boost=.511, mlp=.502),
                       "const": dict(zero=.502, const=.502, linear=.502, boost=.510, mlp=.502),
                       "linear": dict(zero=.444, const=.077, linear=.059, boost=.049, mlp=.034),
                       "boost": dict(zero=.444, const=.034, linear=.015, boost=.009, mlp=.007),
                       "mlp": dict(zero=.445, const=.032, linear=.015, boost=.009, mlp=.008)},
         "horses": {"zero": dict(zero=.246, const=.246, linear=.247, boost=.244, mlp=.245),
                    "const": dict(zero=.246, const=.246, linear=.247, boost=.244, mlp=.245),
                    "linear": dict(zero=.185, const=.185, linear=.168, boost=.154, mlp=.156),
                    "boost": dict(zero=.103, const=.098, linear=.092, boost=.084, mlp=.086),
                    "mlp": dict(zero=.096, const=.094, linear=.087, boost=.080, mlp=.081)}}


class LearningCurve(L.Callback):
    """Train and evaluation error after learning iterations 1, 2, 3, 5 and every ``every``-th (and the last), and
    Algorithm 1's seconds of every iteration (``train/iteration_seconds``)."""

    def __init__(self, train: tuple, evaluation: tuple, every: int, last: int) -> None:
        self.train, self.evaluation, self.every, self.last = train, evaluation, every, last
        self.points: list[list[float]] = []
        self.seconds: list[float] = []

    def on_train_epoch_end(self, trainer: L.Trainer, model: LogisticEnergy) -> None:
        self.seconds.append(float(trainer.callback_metrics["train/iteration_seconds"]))
        k = trainer.current_epoch + 1
        if self.every and (k in (1, 2, 3, 5) or k % self.every == 0 or k == self.last):
            self.points.append([k, *(round(error(model, *split)[0], 4) for split in (self.train, self.evaluation))])


def error(model: LogisticEnergy, x, y) -> tuple[float, torch.Tensor]:
    """Pixel error of the model's predictions on (x, y), and the predictions [N, n]."""
    model.eval()
    with torch.no_grad():
        y_hat = model(x.to(model.device)).cpu()
    model.train()
    return float((y_hat != y).float().mean()), y_hat


def datamodule(args: argparse.Namespace):
    """The cell's data: the denoising images, or the horses with the chosen grid and split."""
    if args.dataset == "denoising":
        return DenoisingDataModule(num_train=args.train, num_test=args.test, height=args.size, width=args.size,
                                   batch_size=args.batch_size)
    return SegmentationDataModule(root=args.root, height=args.height, width=args.width, hog_cell=args.hog_cell,
                                  test_fraction=args.test_fraction, val_fraction=args.val_fraction,
                                  batch_size=args.batch_size)


def grid_name(args: argparse.Namespace) -> str:
    return f"{args.height}x{args.width}_cell{args.hog_cell}"


def run_cell(unary: str, pairwise: str, args: argparse.Namespace) -> dict:
    """Train one cell with the Lightning Trainer; test (or validation) and train error, seconds per learning
    iteration, the learning curve, and on the horses the segmentation scores."""
    L.seed_everything(0, workers=True)
    dm = datamodule(args)
    model = LogisticEnergy(dm.num_features, dm.num_labels, **dm.learner_inputs, unary=unary, pairwise=pairwise,
                           fit_epochs=args.fit_epochs, method=args.method, **({"lr": args.lr} if args.lr else {}))
    validating = args.dataset == "horses" and args.val_fraction > 0
    evaluation = (dm.data_val.inputs, dm.data_val.y) if validating else dm.test_tensors
    curve = LearningCurve(dm.train_tensors, evaluation, args.curve_every if args.method == "logistic" else 0,
                          args.iters)
    trainer = L.Trainer(max_epochs=args.iters, accelerator=args.device, devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[curve] if args.method == "logistic" else [], limit_val_batches=0)
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    wall = (time.perf_counter() - t0) / args.iters
    (test_error, y_hat), (train_error, _) = error(model, *evaluation), error(model, *dm.train_tensors)
    images = f"{args.train}+{args.test} of {args.size}x{args.size}" if args.dataset == "denoising" else \
        f"{len(dm.data_train)}+{len(evaluation[1])} of {args.height}x{args.width}"
    cell = {"unary": unary, "pairwise": pairwise, "method": args.method, "lr": args.lr,
            "batch_size": args.batch_size, ("val_error" if validating else "test_error"): round(test_error, 4),
            "train_error": round(train_error, 4), "paper_test_error": PAPER[args.dataset][unary][pairwise],
            "iterations": args.iters, "fit_epochs": args.fit_epochs,
            "seconds_per_iteration": round(wall, 3),
            "iteration_seconds": round(sum(curve.seconds) / len(curve.seconds), 3) if curve.seconds else None,
            "device": args.device, "images": images,
            "final_objective": round(float(trainer.callback_metrics["train/objective"]), 3), "curve": curve.points}
    if args.dataset == "horses":
        counts = ExampleCounts()
        counts.update(y_hat, evaluation[1])
        per_image = counts.compute()
        errors = (per_image[:, 1] + per_image[:, 2]).double() / per_image.sum(1)
        cell.update(hog_cell=args.hog_cell, test_fraction=args.test_fraction, val_fraction=args.val_fraction,
                    **{k: round(v, 4) for k, v in segmentation_scores(per_image).items()},
                    standard_error=round(float(errors.std() / len(errors) ** 0.5), 4))
    if (unary, pairwise) in PICTURED and args.method == "logistic" and not validating:
        shown = (evaluation[0].unary[:4, :, model.picture_features], evaluation[1][:4], y_hat[:4])
        cell["shown"] = [t.tolist() for t in shown]
    return cell


def write_outputs(out: Path, args: argparse.Namespace) -> None:
    """Rebuild the tables and pictures of ``args.dataset`` from all cells saved under ``<out>_cells``."""
    if args.dataset == "horses":
        write_horses(out)
    else:
        write_denoising(out, args.size)


def write_denoising(out: Path, size: int) -> None:
    cells: dict[str, dict] = {"logistic": {}, "hinge": {}}
    for f in sorted((out.parent / f"{out.name}_cells").glob("*.json")):
        c = json.loads(f.read_text())
        cells[c["method"]][(c["unary"], c["pairwise"])] = c
    if not cells["logistic"]:
        return
    detail = [{k: v for k, v in c.items() if k not in ("shown", "curve")} for m in cells.values() for c in m.values()]
    write_table(detail, out.parent / f"{out.name}_runs")
    missing = [f"{u}/{p}" for u in CLASSES for p in CLASSES if (u, p) not in cells["logistic"]]
    footer = ["", "Test error of LogisticEnergy (the paper's Table 1, denoising, in parentheses); rows: unary "
              "class, columns: pairwise class. Settings and times per learning iteration: "
              f"`{out.name}_runs.md` (seconds_per_iteration: wall time of the run, on a shared machine; CPU seconds "
              f"per iteration: `scripts/results/bench_logistic.json`). Cells not run: "
              f"{', '.join(missing) if missing else 'none'}."]
    if cells["hinge"]:
        hinge = []
        for (u, p), c in sorted(cells["hinge"].items()):
            ref = cells["logistic"].get((u, p), {})
            hinge.append([f"{NAMES[u]} / {NAMES[p]}", f"{c['test_error']:.3f}", ref.get("test_error", "-"),
                          f"{c['final_objective']:.0f}", ref.get("final_objective", "-"),
                          f"{c['iterations']}, {c['lr'] or 'model.lr'}, {c['batch_size']}"])
        footer += ["", "Baseline: the same energies trained end to end on the smoothed-LP hinge (Adam through the "
                   "Danskin gradient, `--method hinge`), beside Algorithm 1; the final training objectives (eq. 12, "
                   "summed over the training images) show whether the hinge run got anywhere near Algorithm 1's "
                   "optimum:", "",
                   *markdown(["unary / pairwise", "test error: hinge", "logistic", "objective: hinge", "logistic",
                              "hinge epochs, lr, batch"], hinge)]
    write_table(_table_rows(cells["logistic"], PAPER["denoising"]), out, footer=footer)
    _picture(cells["logistic"], out.with_suffix(".png"), size)


def _table_rows(cells: dict, paper: dict) -> list[dict]:
    rows = []
    for u in CLASSES:
        row = {"unary \\ pairwise": NAMES[u]}
        for p in CLASSES:
            c = cells.get((u, p))
            row[NAMES[p]] = f"{c['test_error']:.3f} ({paper[u][p]:.3f})" if c else f"- ({paper[u][p]:.3f})"
        rows.append(row)
    return rows


def write_horses(out: Path) -> None:
    """The horses' Table 1 (``<out>.md``, with each run cell's scores and times), the runs, the grid selection on
    held-out training images (``<out>_selection.md``), Fig. 2 (``<out>_curves.png``) and Fig. 3 (``<out>.png``)."""
    saved = [json.loads(f.read_text()) for f in sorted((out.parent / f"{out.name}_cells").glob("*.json"))]
    tested = {(c["unary"], c["pairwise"]): c for c in saved if "test_error" in c and c["method"] == "logistic"}
    selection = [c for c in saved if "val_error" in c]
    if selection:
        write_table([{"grid": c["images"].split(" of ")[1], "hog_cell": c["hog_cell"],
                      "unary / pairwise": f"{NAMES[c['unary']]} / {NAMES[c['pairwise']]}",
                      "iterations": c["iterations"], "validation error": c["val_error"],
                      "train error": c["train_error"], "s / iteration": c["iteration_seconds"]}
                     for c in sorted(selection, key=lambda c: (c["unary"], c["images"], c["hog_cell"]))],
                    out.parent / f"{out.name}_selection", footer=[
                        "", "Validation error on a seeded 25% of the training images (the models trained on the "
                        "other 75%; the test images unused), for choosing the grid size and the HOG cell: the "
                        "setting of the lowest MLP / MLP error (the paper's best function class), the smaller grid "
                        "where two are within 0.005 (one standard error of these 43 images is about 0.01). s / "
                        "iteration: one thread of a 2-core machine shared with other jobs."])
    if not tested:
        return
    write_table([{k: v for k, v in c.items() if k not in ("shown", "curve")} for c in tested.values()],
                out.parent / f"{out.name}_runs")
    detail = [[f"{NAMES[u]} / {NAMES[p]}", f"{c['test_error']:.3f} ({c['paper_test_error']:.3f})",
               f"{c['standard_error']:.3f}" if "standard_error" in c else "-",
               f"{c['train_error']:.3f}", f"{c['iou']:.3f}", f"{c['image_iou']:.3f}",
               f"{c['image_error_median']:.3f} / {c['image_error_max']:.3f}", c["iterations"],
               f"{c['iteration_seconds']:.1f}", f"{c['seconds_per_iteration']:.1f}"]
              for u in CLASSES for p in CLASSES if (c := tested.get((u, p)))]
    first = next(iter(tested.values()))
    missing = [f"{u}/{p}" for u in CLASSES for p in CLASSES if (u, p) not in tested]
    footer = ["", f"Test pixel error of LogisticEnergy on the Weizmann horses (the paper's Table 1, horses, in "
              f"parentheses); rows: unary class, columns: pairwise class. {first['images']} images (train + test; "
              f"a seeded split of {first['test_fraction']:.0%} of the 246 for testing), every image and mask resized "
              f"to that grid, HOG cells of {first['hog_cell']} pixels. Cells not run: "
              f"{', '.join(missing) if missing else 'none'}.", "",
              *markdown(["unary / pairwise", "test error (paper)", "standard error", "train error", "IoU",
                         "mean image IoU", "image error median / max", "iterations", "s / iteration",
                         "wall s / iteration"], detail),
              "", "Standard error: of the test error, over the test images (their errors' standard deviation / "
              "sqrt(number of test images)). s / iteration: Algorithm 1's own time per learning iteration (fit u, 25 "
              "passes, fit v, 25 passes), one thread of a 2-core machine shared with other jobs; wall: the whole run "
              "divided by the iterations (with the learning curve's evaluations). Curves: "
              f"`{out.name}_curves.png`; predictions: `{out.name}.png`; every setting: `{out.name}_runs.md`."]
    write_table(_table_rows(tested, PAPER["horses"]), out, footer=footer)
    _curves(tested, out.parent / f"{out.name}_curves.png")
    _horse_pictures(tested, out.with_suffix(".png"), first["images"].split(" of ")[1])


def _picture(cells: dict, path: Path, size: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [(f"{u}/{p}", cells[(u, p)]) for u, p in PICTURED if "shown" in cells.get((u, p), {})]
    if not shown:
        return
    noisy, y, _ = (torch.tensor(t) for t in shown[0][1]["shown"])
    rows = [("labels", y), ("noisy input", noisy)] + [(name, torch.tensor(c["shown"][2])) for name, c in shown]
    fig, axes = plt.subplots(len(rows), len(y), figsize=(2.6 * len(y), 2.6 * len(rows)), squeeze=False)
    for r, (name, imgs) in enumerate(rows):
        for c in range(len(y)):
            ax = axes[r][c]
            ax.imshow(imgs[c].float().reshape(size, size).numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(name)
    fig.suptitle("Domke denoising: test images, noisy input, predictions (unary/pairwise)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _curves(cells: dict, path: Path) -> None:
    """The paper's Fig. 2: train (dashed) and test (solid) error against learning iterations, one panel per unary
    class, one colour per pairwise class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [u for u in CLASSES if any(k[0] == u for k in cells)]
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.6), squeeze=False, sharey=True)
    for ax, u in zip(axes[0], rows):
        for k, p in enumerate(CLASSES):
            c = cells.get((u, p))
            if c is None or not c["curve"]:
                continue
            it, train, test = zip(*c["curve"])
            ax.plot(it, train, "--", color=f"C{k}")
            ax.plot(it, test, "-", color=f"C{k}", label=f"{NAMES[p]} pairwise")
        ax.set_title(f"{NAMES[u]} unary")
        ax.set_xlabel("learning iteration")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("pixel error (dashed: train, solid: test)")
    fig.suptitle("Domke Fig. 2, horses: univariate error against learning iterations")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _horse_pictures(cells: dict, path: Path, grid: str) -> None:
    """The paper's Fig. 3: test images, their true masks and the predictions of the pictured cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [(f"{NAMES[u]} / {NAMES[p]}", cells[(u, p)]) for u, p in PICTURED if "shown" in cells.get((u, p), {})]
    if not shown:
        return
    h, w = map(int, grid.split("x"))
    image, y, _ = (torch.tensor(t) for t in shown[0][1]["shown"])
    rows = [("image", image.reshape(-1, h, w, 3)), ("true mask", y.reshape(-1, h, w))]
    rows += [(name, torch.tensor(c["shown"][2]).reshape(-1, h, w)) for name, c in shown]
    fig, axes = plt.subplots(len(rows), len(y), figsize=(2.4 * len(y) * w / h, 2.4 * len(rows)), squeeze=False)
    for r, (name, pictures) in enumerate(rows):
        for c in range(len(y)):
            ax = axes[r][c]
            ax.imshow(pictures[c].float().numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(name)
            if r >= 2:
                ax.set_xlabel(f"error {float((pictures[c] != rows[1][1][c]).float().mean()):.3f}")
    fig.suptitle("Domke Fig. 3, horses: test images, true masks, predictions (unary / pairwise)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=("denoising", "horses"), default="denoising")
    ap.add_argument("--cells", nargs="*", default=["linear/linear", "mlp/mlp"],
                    help="unary/pairwise pairs, or 'all' for the whole table")
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--fit-epochs", type=int, default=5, help="MLP SGD passes over the positions per fit")
    ap.add_argument("--size", type=int, default=100, help="denoising: image side")
    ap.add_argument("--train", type=int, default=16, help="denoising: training images")
    ap.add_argument("--test", type=int, default=16, help="denoising: test images")
    ap.add_argument("--height", type=int, default=45, help="horses: the grid every image is resized to")
    ap.add_argument("--width", type=int, default=60)
    ap.add_argument("--hog-cell", type=int, default=6, help="horses: HOG cell side in grid pixels")
    ap.add_argument("--root", default=None, help="horses: a folder of images and masks, as data.root (<root>/rgb + "
                    "figure_ground split by --test-fraction, or <root>/train/ + <root>/test/); default: the cache")
    ap.add_argument("--test-fraction", type=float, default=0.3, help="horses: seeded share of the images for testing")
    ap.add_argument("--val-fraction", type=float, default=0.0,
                    help="horses: > 0 holds out this share of the training images and reports the error on them")
    ap.add_argument("--curve-every", type=int, default=10, help="learning curve: evaluate every k-th iteration")
    ap.add_argument("--method", choices=("logistic", "hinge"), default="logistic")
    ap.add_argument("--lr", type=float, default=None, help="--method hinge: Adam's step (default: model.lr)")
    ap.add_argument("--batch-size", type=int, default=16, help="--method hinge: images per Adam step")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None,
                    help="default: experiments/results/domke_table1 (denoising), domke_table1_horses (horses)")
    ap.add_argument("--table-only", action="store_true", help="only rebuild the table from the saved cells")
    args = ap.parse_args()
    out = args.out or ROOT / "experiments" / "results" / ("domke_table1" + ("_horses" if args.dataset == "horses"
                                                                             else ""))
    torch.set_num_threads(1)
    cells = [(u, p) for u in CLASSES for p in CLASSES] if args.cells == ["all"] else \
        [tuple(c.split("/")) for c in args.cells]
    if not args.table_only:
        for u, p in cells:
            if u not in FUNCTIONS or p not in FUNCTIONS:
                print(f"skipping {u}/{p}: function class not available (have {list(FUNCTIONS)})")
                continue
            cell = run_cell(u, p, args)
            folder = out.parent / f"{out.name}_cells"
            folder.mkdir(parents=True, exist_ok=True)
            suffix = "_hinge" if args.method == "hinge" else \
                f"_{grid_name(args)}_val" if args.dataset == "horses" and args.val_fraction > 0 else ""
            (folder / f"{u}_{p}{suffix}.json").write_text(json.dumps(cell))
            print({k: v for k, v in cell.items() if k not in ("shown", "curve")}, flush=True)
    write_outputs(out, args)


if __name__ == "__main__":
    main()
