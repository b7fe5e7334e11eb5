"""A new model in ~20 lines: subclass StructuredLearner and supply an energy.

    python experiments/custom_energy.py [--data emotions|scene|yeast|synthetic] [--epochs 30]

Here: an MLP scores each label, a learned 2x2 table couples neighbouring labels of a chain.
Loss (structured hinge), inference (exact tree MAP), metrics and logging come from the base class.
"""

import argparse

import lightning as L
import torch
from torch import nn

import structtorch as st
from structtorch.data import MultilabelDataModule, SyntheticDataModule
from structtorch.energies import Energy
from structtorch.learners import StructuredLearner


class MLPChainEnergy(Energy):
    def __init__(self, num_features: int, num_labels: int, hidden: int = 64) -> None:
        super().__init__()
        self.graph = st.Graph.chain(num_labels)
        self.mlp = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, num_labels))
        self.table = nn.Parameter(torch.zeros(num_labels - 1, 2, 2))  # pairwise [E, K, K]

    def forward(self, x: torch.Tensor) -> st.Potentials:
        s = self.mlp(x)  # [B, n]: score of label i being on
        return st.Potentials(torch.stack([torch.zeros_like(s), s], -1), self.table, self.graph)


class MLPChain(StructuredLearner):
    def build_energy(self) -> Energy:
        return MLPChainEnergy(self.hparams.num_features, self.hparams.num_labels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="emotions")
    ap.add_argument("--root", default=None, help="local Mulan copy <root>/<name>/...; default: the download cache")
    ap.add_argument("--epochs", type=int, default=30)
    args = ap.parse_args()
    L.seed_everything(0)
    dm = SyntheticDataModule() if args.data == "synthetic" else MultilabelDataModule(args.data, root=args.root)
    model = MLPChain(dm.num_features, dm.num_labels, lr=3e-3, l2=1e-3)
    trainer = L.Trainer(max_epochs=args.epochs, logger=False, enable_checkpointing=False)
    trainer.fit(model, datamodule=dm)
    print(trainer.test(model, datamodule=dm, verbose=False)[0])


if __name__ == "__main__":
    main()
