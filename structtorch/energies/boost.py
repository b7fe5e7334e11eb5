"""Boosted regression trees as a local function class (Domke 2013, Sec. 8), by xgboost (optional extra:
``pip install structtorch[boost]``).

Each fit adds ``rounds`` boosting rounds (one regression tree per state) to the ensemble, continuing from
the current trees with the rows' biases as xgboost's per-row base margins, so the trees are grown on the
gradient of the *biased* logistic loss (eq. 13) at (current function + bias). As in the paper: shrinkage
.25, leaf values set by a step on the logistic loss, and every leaf holding at least ~5% of the data, here
as xgboost's ``min_child_weight`` = 5% of the fit's total hessian (xgboost bounds leaves by hessian weight,
not by row count). The paper optimises the leaf values; xgboost takes one Newton step per leaf, which
diverges here (the biases saturate many rows' probabilities: gradient ~1, hessian ~0), so leaf steps are
capped (``max_delta_step`` = 5, L2 ``lambda`` = 1): stable, but slower than the paper's boosting. No row
subsampling (deterministic).
"""

from __future__ import annotations

import numpy as np
import torch

from .functions import LocalFunction, _check_fit_args

__all__ = ["BoostedTrees", "boost_available"]


def boost_available() -> bool:
    """True when xgboost can be imported (the ``boost`` function class needs it)."""
    try:
        import xgboost  # noqa: F401
    except ImportError:
        return False
    return True


def _xgb():
    try:
        import xgboost
    except ImportError as err:
        raise ImportError("the boost function class needs xgboost: pip install 'structtorch[boost]' "
                          "(or pip install xgboost)") from err
    return xgboost


class BoostedTrees(LocalFunction):
    """f(phi) = sum of the ensemble's trees: phi [..., D] -> scores [..., C] (0 before the first fit).

    The ensemble is kept as xgboost's serialised model in the uint8 buffer ``model`` (checkpointed);
    predictions run on the CPU and come back on the input's device.
    """

    def __init__(self, in_features: int, out_features: int, rounds: int = 1, shrinkage: float = 0.25,
                 min_leaf: float = 0.05, max_depth: int = 6, seed: int = 0) -> None:
        super().__init__(in_features, out_features)
        _xgb()
        if out_features < 2:
            raise ValueError(f"BoostedTrees needs >= 2 states (a softmax), got out_features={out_features}")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"BoostedTrees: rounds must be a positive int, got {rounds!r}")
        self.rounds, self.seed = rounds, seed
        self.params = {"objective": "multi:softprob", "num_class": out_features, "eta": shrinkage,
                       "max_depth": max_depth, "tree_method": "hist", "nthread": 1, "seed": seed,
                       "lambda": 1.0, "max_delta_step": 5.0, "base_score": 0.0}
        self.min_leaf = float(min_leaf)
        self.register_buffer("model", torch.zeros(0, dtype=torch.uint8))
        self._booster = None  # deserialised from ``model`` on first use

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        saved = state_dict.get(prefix + "model")
        if saved is not None:  # the ensemble grows: take the checkpoint's size
            self.model = torch.empty_like(saved, device=self.model.device)
        self._booster = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def booster(self):
        """The xgboost Booster of the current ensemble, or None before the first fit."""
        if self._booster is None and self.model.numel():
            self._booster = _xgb().Booster(params={"nthread": 1}, model_file=bytearray(self.model.cpu().numpy()))
        return self._booster

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (*x.shape[:-1], self.out_features)
        booster = self.booster()
        if booster is None:
            return x.new_zeros(shape)
        data = _xgb().DMatrix(x.detach().reshape(-1, self.in_features).cpu().numpy(), nthread=1)
        margin = booster.predict(data, output_margin=True).reshape(shape)
        return torch.from_numpy(margin).to(device=x.device, dtype=x.dtype)

    def fit(self, x: torch.Tensor, bias: torch.Tensor, target: torch.Tensor,
            generator: torch.Generator | None = None) -> float:
        _check_fit_args(self, x, bias, target)
        xgb = _xgb()
        with torch.no_grad():
            p = torch.softmax((self(x) + bias).double(), -1)
            hessian = float((p * (1 - p)).sum()) / self.out_features  # per class, summed over rows
        data = xgb.DMatrix(x.cpu().numpy(), label=target.cpu().numpy(), nthread=1,
                           base_margin=bias.cpu().numpy().astype(np.float32))  # eq. (13): f + b
        params = {**self.params, "min_child_weight": self.min_leaf * hessian}
        booster = xgb.train(params, data, num_boost_round=self.rounds, xgb_model=self.booster())
        self._booster = booster
        self.model = torch.frombuffer(bytearray(booster.save_raw("ubj")), dtype=torch.uint8).to(self.model.device)
        return self._loss(x, bias, target)
