"""Multi-layer perceptron local functions f(phi) = W sigma(U phi + c) + d, fitted as in Domke (2013, Sec. 8):
SGD with momentum .9 (each step .1 x the new gradient + .9 x the old step) on minibatches of 1000 rows."""

from __future__ import annotations

import torch
from torch import nn

from ..graph import check_float, check_int
from .functions import LocalFunction, biased_logistic_loss, check_fit_args

__all__ = ["MLPFunction"]


class MLPFunction(LocalFunction):
    """One hidden layer of ``hidden`` sigmoid units: phi [..., D] -> scores [..., C].

    ``fit`` runs ``epochs`` passes of minibatch SGD (``batch_size`` rows, step ``lr``, momentum .9 with
    dampening .9: step = .9 step + .1 grad) over the rows in an order drawn from ``generator``, from the
    current weights. Initial weights: PyTorch's ``nn.Linear`` init drawn from ``seed``.
    """

    def __init__(self, in_features: int, out_features: int, hidden: int = 20, lr: float = 0.25, epochs: int = 1,
                 batch_size: int = 1000, seed: int = 0) -> None:
        super().__init__(in_features, out_features)
        for name, v in (("hidden", hidden), ("epochs", epochs), ("batch_size", batch_size)):
            check_int(v, f"MLPFunction: {name}", 1)
        self.lr, self.epochs, self.batch_size = check_float(lr, "MLPFunction: lr", 0.0), epochs, batch_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.hidden = nn.Linear(in_features, hidden)
            self.out = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.sigmoid(self.hidden(x.to(self.out.weight.dtype))))

    def fit(self, x: torch.Tensor, bias: torch.Tensor, target: torch.Tensor,
            generator: torch.Generator | None = None) -> float:
        check_fit_args(self, x, bias, target)
        dtype = self.out.weight.dtype
        x, bias = x.to(dtype), bias.to(dtype)
        opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, dampening=0.9)
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        with torch.enable_grad():
            for _ in range(self.epochs):
                order = torch.randperm(len(x), generator=gen).to(x.device)
                for rows in order.split(self.batch_size):  # minibatch SGD steps (not a per-example loop)
                    opt.zero_grad()
                    biased_logistic_loss(self(x[rows]), bias[rows], target[rows]).backward()  # eq. (13)
                    opt.step()
        return self._loss(x, bias, target)
