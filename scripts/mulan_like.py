"""Write a synthetic Mulan dataset folder shaped like a Mulan set that is not on this machine, for running the CLI's
commands on that shape (``data=mulan data.root=<root> data.name=<name>``).

    python scripts/mulan_like.py --shape bibtex --root /tmp/mulan_like
    python -m structtorch.train model=full data=mulan data.root=/tmp/mulan_like data.name=bibtex-like

Shapes (training rows, test rows, features, labels) follow Mulan's files; the rows come from
``structtorch.data.sparse_multilabel`` (sparse binary word features, Zipf-distributed labels with many rare ones,
about 1.25 labels a row, as genbase, or ``--cardinality``: Mulan's enron has 3.38, bibtex 2.40, corel5k 3.52, cal500
26.04, foodtruck 2.29, rcv1subset1 2.88, mediamill 4.38, bookmarks 2.03). Foodtruck's 21 features are survey
answers (nominal and numeric), here binary; rcv1subset's 47,236 are tf-idf weights in Mulan's, here binary, about
19 a row. Written as sparse ARFF with ``{0,1}`` attributes and a label XML, as Mulan's text sets are. Mediamill's
120 features are dense video descriptors: there the labels are drawn as above and the features are numbers,
x = y A + noise (``dense_features``), written as dense ARFF with numeric attributes. Bookmarks (87,856 rows, 208
labels) has one file: the loader splits off 30% as the test set.
Timing and memory on these folders say what a learner does at that size; their accuracies say nothing of the real
data's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from structtorch.data import sparse_multilabel

#: shape -> (training rows, test rows, features, labels); 0 test rows: one <name>.arff without a split, as Mulan's
#: cal500 (the loader splits off 30% as the test set)
SHAPES = {"medical": (333, 645, 1449, 45), "enron": (1123, 579, 1001, 53), "bibtex": (4880, 2515, 1836, 159),
          "corel5k": (4500, 500, 499, 374), "cal500": (502, 0, 68, 174), "genbase": (463, 199, 1186, 27),
          "foodtruck": (407, 0, 21, 12), "rcv1subset": (3000, 3000, 47236, 101), "mediamill": (30993, 12914, 120, 101),
          "bookmarks": (87856, 0, 2150, 208)}
#: shapes whose features are dense numbers (``dense_features``), not sparse binary words
DENSE = {"mediamill"}


def dense_features(y: torch.Tensor, num_features: int, seed: int = 0) -> torch.Tensor:
    """x [N, D] = y A + E for labels y [N, n]: each label shifts the features along its own direction A_j ~ N(0,
    0.36 I), under N(0, 2.25 I) noise E (scales chosen so that labels are learnable, not separable)."""
    gen = torch.Generator().manual_seed(seed)
    A = 0.6 * torch.randn(y.shape[1], num_features, generator=gen)
    return y.float() @ A + 1.5 * torch.randn(len(y), num_features, generator=gen)


def arff_header(relation: str, D: int, L: int, feature_type: str) -> list[str]:
    """An ARFF header up to ``@data``: D features f<j> of ``feature_type``, then L {0,1} labels label<j>."""
    return [f"@relation {relation}", "", *[f"@attribute f{j} {feature_type}" for j in range(D)],
            *[f"@attribute label{j} {{0,1}}" for j in range(L)], "", "@data"]


def write_arff(path: Path, relation: str, x: torch.Tensor, y: torch.Tensor) -> None:
    """Sparse ARFF of x [N, D] in {0, 1} then y [N, L] as {0,1} attributes named f<j> and label<j>."""
    lines = arff_header(relation, x.shape[1], y.shape[1], "{0,1}")
    for row in torch.cat([x.long(), y], 1):
        lines.append("{" + ",".join(f"{j} 1" for j in row.nonzero().flatten().tolist()) + "}")
    path.write_text("\n".join(lines) + "\n")


def write_dense_arff(path: Path, relation: str, x: torch.Tensor, y: torch.Tensor) -> None:
    """Dense ARFF of x [N, D] (numeric attributes f<j>, 4 decimals) then y [N, L] as {0,1} attributes label<j>."""
    lines = arff_header(relation, x.shape[1], y.shape[1], "numeric")
    for xs, ys in zip(x.tolist(), y.tolist()):
        lines.append(",".join([f"{v:.4f}" for v in xs] + [str(v) for v in ys]))
    path.write_text("\n".join(lines) + "\n")


def write_dataset(root: Path, shape: str, seed: int = 0, cardinality: float = 1.25) -> Path:
    """root/<shape>-like/ with <name>-train.arff, <name>-test.arff (or one <name>.arff where the shape has no test
    rows) and <name>.xml, about ``cardinality`` labels a row; returns the folder."""
    train, test, D, L = SHAPES[shape]
    name = f"{shape}-like"
    x, y = sparse_multilabel(train + test, num_features=D, num_labels=L, seed=seed, cardinality=cardinality)
    write = write_arff
    if shape in DENSE:
        x, write = dense_features(y, D, seed), write_dense_arff
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if test:
        write(folder / f"{name}-train.arff", name, x[:train], y[:train])
        write(folder / f"{name}-test.arff", name, x[train:], y[train:])
    else:
        write(folder / f"{name}.arff", name, x, y)
    labels = "".join(f'<label name="label{j}"></label>\n' for j in range(L))
    (folder / f"{name}.xml").write_text('<?xml version="1.0" encoding="utf-8"?>\n'
                                        f'<labels xmlns="http://mulan.sourceforge.net/labels">\n{labels}</labels>\n')
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["bibtex"])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cardinality", type=float, default=1.25, help="mean labels per row (default 1.25)")
    args = parser.parse_args()
    for shape in args.shape:
        print(write_dataset(args.root, shape, args.seed, args.cardinality))


if __name__ == "__main__":
    main()
