"""The certified strategies of linear energies: full-batch L-BFGS on the smoothed loss (``SmoothedLBFGS``),
block-coordinate Frank-Wolfe in the dual (``BCFW``) and, for one linear SVM per label (Independent), dual coordinate
descent (``DualCD``). All log ``train/duality_gap`` (relative, the worst
model's) after their certificates and stop the run once every model's gap is <= ``model.tol``;
``max_epochs`` is a cap. A regularisation grid (``model.l2=[...]``) is their batch of models."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from ..graph import Graph
from ..progress import OutOfTime, out_of_time, phase, tick
from ..solvers import BCFW, DualCD, GapInfo, SmoothedLBFGS, StepInfo
from ..solvers.bcfw import per_param
from .base import Strategy

__all__ = ["BCFWStrategy", "Certified", "DCDStrategy", "LBFGSStrategy", "lbfgs_dtype", "lbfgs_solver"]

#: seconds past trainer.time_budget that a closing certificate's pass may always take (where half its expected time
#: is less): RTA at enron's shape with 3.4 labels a row cut a 2 s pass after 1 s, 1 s from its end, and reported no gap
CERTIFICATE_GRACE_S = 5.0


class Certified(Strategy):
    """What the certified strategies share: the energy must be linear in its parameters; the last
    certificate (``certificate``) is logged, reported and decides when to stop."""

    def __init__(self, learner) -> None:
        super().__init__(learner)
        self.certificate: GapInfo | None = None
        self.stale = False  # steps were taken since ``certificate``
        self.unfit: str | None = None  # why the run ends without a certificate (it would not fit the time budget)

    def check(self) -> None:
        energy = self.learner.energy
        if min(self.learner.l2_grid) <= 0:
            raise ValueError(f"solver={self.name} certifies a strongly convex objective: model.l2 must be > 0, got "
                             f"{self.learner.hparams.l2}")
        if not getattr(energy, "is_linear", False):
            raise ValueError(f"solver={self.name} needs an energy linear in its parameters; "
                             f"{type(self.learner).__name__} uses {type(energy).__name__}: use solver=adam")

    def training_tensors(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The training set on the learner's device and dtype, labels as the energy holds them."""
        learner = self.learner
        dtype = next(learner.energy.parameters()).dtype
        return x.to(learner.device, dtype), learner.energy_labels(y.to(learner.device))

    def log_certificate(self, info: GapInfo) -> bool:
        """Keep, log and judge a certificate: True when every model is certified."""
        self.certificate, self.stale = info, False
        self.learner.log("train/duality_gap", info.relative_gap.max().float(), prog_bar=True)
        self.learner.log("train/objective", info.primal.sum().float())
        self.learner.log("train/dual", info.dual.sum().float())
        return bool(info.converged.all())

    def report(self) -> dict[str, Any]:
        if self.unfit is not None:
            return {"solver": self.name, **dict.fromkeys(("primal", "dual", "gap", "relative_gap")),
                    "converged": False, "certificate": self.unfit, "tol": self.learner.hparams.tol}
        info = self.certificate if self.certificate is not None else self.certify()
        report = {"solver": self.name, **{k: plain(getattr(info, k)) for k in ("primal", "dual", "gap",
                                                                             "relative_gap", "converged")}}
        return report | {"tol": self.learner.hparams.tol, "rounding_tolerance": info.rounding_tolerance}

    def certify(self) -> GapInfo:
        """The certificate of the current weights: the solver's last one while it is current, else a new one."""
        return self.solver.last if self.solver.last is not None else self.solver.certify()

    def train_end(self) -> None:
        """A run stopped before its first exact certificate, or that stepped after its last one, gets one now (of
        the weights it ends with), on the device it trained on (after fit the learner is back on the CPU while the
        strategy's copy of the training set stays on the GPU), unless it would run far past the time budget
        (``certificate_fits``): then the run reports no certificate, and why."""
        if self.certificate is None or self.stale:
            if self.certificate_fits():
                self.certificate, self.stale = self.certify(), False
            else:
                self.certificate = None
                seconds = self.certificate_seconds()  # 0: no step after the first was timed
                why = (f"its pass over the training set would take about {seconds:.0f} s at this run's pace, past "
                       f"trainer.time_budget" if seconds > 0 else
                       "trainer.time_budget was spent before a second step could time its pass over the training set")
                self.unfit = self.unfit or f"not computed: {why}"

    def certificate_fits(self) -> bool:
        """Whether a certificate now is expected to end by the time budget plus its grace (``certificate_grace``):
        always without a budget, and once the steps stopped to keep its time (the rest of the epoch and the
        validation pass may have spent some of it); while the budget lasts where its time is unknown (grace 0);
        never again once a pass was cut at the budget (``unfit``), and the steps then keep no time for one."""
        return self.unfit is None and (self.reserved or not out_of_time(
            reserve=self.certificate_seconds() - self.certificate_grace()))

    def certificate_seconds(self) -> float:
        """The expected time of an exact certificate (0: unknown)."""
        return 0.0

    def certificate_grace(self) -> float:
        """How far past the time budget a certificate may end: half its expected time, at least
        ``CERTIFICATE_GRACE_S``; 0 where its time is unknown (a pass of a time no step has measured could run far
        past the budget before its pace is known)."""
        seconds = self.certificate_seconds()
        return max(seconds / 2, CERTIFICATE_GRACE_S) if seconds > 0 else 0.0

    def warning(self) -> str | None:
        if self.unfit is not None:
            return f"training stopped at {self.learner.training_cap()} without a certificate: {self.unfit}"
        info = self.certificate
        if info is None or bool(info.converged.all()):
            return None
        return (f"training stopped at {self.learner.training_cap()} before the certificate: relative duality gap "
                f"{float(info.relative_gap.max()):.2g} > model.tol={self.learner.hparams.tol:g}; raise it (or "
                f"model.solver_iters) to reach the certificate")


#: potential entries N (n + E) K^2 above which L-BFGS computes in float32 (half the memory traffic of float64;
#: its certificate stays within float32's rounding, ``rounding_tolerance``): delicious has 1e8, yeast 2e5
FLOAT32_ABOVE = 1 << 24
#: a float32 fit goes on in float64 once its relative gap is within this many times tol (``LBFGSStrategy``): Full on
#: 6,000 rows of tmc2007 in float32 slowed from 12 to 2-3 L-BFGS iterations a second below a gap of about 5e-3 and
#: certified in 356 s, against 153 s in float64 (whose 1e-3 certificate float32's line searches barely resolve)
FLOAT64_WITHIN = 10.0


class LBFGSStrategy(Certified):
    """Full-batch L-BFGS on the entropy-smoothed hinge (temperature lowered until the gap certifies it) or on
    the CRF likelihood (eps = 1): up to ``solver_iters`` iterations per epoch, certified every 20; in float64,
    or in float32 for problems of more than ``FLOAT32_ABOVE`` potential entries until the gap is within
    ``FLOAT64_WITHIN`` times tol (``finish_in_float64``)."""

    name = "lbfgs"

    def check(self) -> None:
        super().check()
        learner, hp = self.learner, self.learner.hparams
        if learner.margin != "hamming":
            raise ValueError(f"solver=lbfgs smooths the Hamming-margin hinge; margin={learner.margin} needs "
                             f"solver=bcfw (or adam)")
        if learner.smoothed_max() is None:
            raise ValueError(f"solver=lbfgs needs a smoothed training max; {type(learner).__name__} with "
                             f"train_inference={hp.get('train_inference', 'a callable')} on {learner.graph} has "
                             f"none: use solver=adam")

    def setup(self, x: torch.Tensor, y: torch.Tensor, state: dict[str, Any] | None = None) -> None:
        learner = self.learner
        x, labels = self.training_tensors(x, y)
        lam, mask = learner.grid_models(len(x))
        start = learner.warm_start(x, y.to(x.device), lam, mask) if state is None else None  # resumed: as saved
        self.problem = x, labels, lam, mask
        self.solver = lbfgs_solver(learner, learner.energy, *self.problem)
        if start is not None:
            self.solver.start_near_optimum(start)
        if state is not None:  # from the checkpoint's weights, at its temperature
            self.solver.eps = torch.as_tensor(state["eps"], dtype=self.solver.eps.dtype, device=self.solver.eps.device)
            self.solver.iterations = state["iterations"]

    def training_step(self, batch: tuple, batch_idx: int) -> None:
        if batch_idx == 0:  # full batch: up to solver_iters iterations per epoch
            self.solver.fit(max_iter=self.solver.iterations + self.learner.hparams.solver_iters, check_every=20,
                            restore=False)
            self.finish_in_float64()
            self.step_counter()

    def finish_in_float64(self) -> None:
        """A float32 fit whose last relative gap is within ``FLOAT64_WITHIN`` times tol goes on in float64 from where
        it is (``SmoothedLBFGS.take_progress``): float32 for the first iterations' speed, float64 for the last
        ones, whose steps float32's objective no longer resolves."""
        old, tol = self.solver, self.learner.hparams.tol
        if old.params[0].dtype != torch.float32 or old.last is None or bool(old.last.converged.all()) or \
                float(old.last.relative_gap.max()) > FLOAT64_WITHIN * tol:
            return
        old.write_back()
        self.solver = lbfgs_solver(self.learner, self.learner.energy, *self.problem, dtype=torch.float64)
        self.solver.take_progress(old)
        rank_zero_info(f"{type(self.learner).__name__} (lbfgs): relative gap {float(old.last.relative_gap.max()):.2g} "
                       f"after {old.iterations} iterations in float32; on in float64")

    def epoch_end(self) -> bool:
        info = self.certify()
        self.learner.log("train/eps", self.solver.eps.max())
        return self.log_certificate(info)

    def train_end(self) -> None:
        """An uncertified run ends on its best certified point (``SmoothedLBFGS.restore_best``), then as
        ``Certified.train_end``."""
        if self.solver.uncertified:
            self.certificate, self.stale = self.solver.restore_best(), False
        super().train_end()

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.name, "eps": self.solver.eps.tolist(), "iterations": self.solver.iterations}

    def checkpoint_weights(self) -> dict[str, torch.Tensor]:
        """Each uncertified model's weights at its best certified point (where that is not the current one), so a
        checkpoint holds the predictor the run reports at its end (``train_end``); a resumed run goes on from there."""
        solver = self.solver
        back = solver.behind() if solver.uncertified else None
        if back is None or not bool(back.any()):
            return {}
        named, chunks = list(solver.energy.named_parameters()), solver.best.params.split(solver.opt.slices.sizes, 1)
        return {name: torch.where(per_param(back, p, solver.num_models), chunk.reshape(p.shape), p.detach())
                for (name, p), chunk in zip(named, chunks)}

    def report(self) -> dict[str, Any]:
        return super().report() | {"iterations": self.solver.iterations, "eps": plain(self.solver.eps)}


class DCDStrategy(Certified):
    """Dual coordinate descent (``DualCD``, liblinear's solver) for an energy without pairwise terms (Independent):
    up to ``solver_iters`` epochs over the training set per training epoch, certified every 5, on the CPU (the fused
    kernel) whatever the learner's device, from alpha = 0 (a resumed run restores alpha)."""

    name = "dcd"

    @staticmethod
    def solves(learner: Any) -> bool:
        """Whether ``learner``'s objective is one linear SVM per label: an energy without pairwise terms
        (``DualCD.supports``), the hinge with the Hamming margin at margin_scale 1."""
        hp = learner.hparams
        return hp.loss == "hinge" and learner.margin == "hamming" and hp.margin_scale == 1.0 and DualCD.supports(
            learner.energy)

    def check(self) -> None:
        super().check()
        learner, hp = self.learner, self.learner.hparams
        if not self.solves(learner):
            raise ValueError(f"solver=dcd solves one linear SVM per label: an energy without pairwise terms "
                             f"(Independent) and loss=hinge, margin=hamming, margin_scale=1; "
                             f"{type(learner).__name__} with loss={hp.loss}, margin={learner.margin}, margin_scale="
                             f"{hp.margin_scale} on {learner.graph} needs solver=lbfgs or bcfw")

    def setup(self, x: torch.Tensor, y: torch.Tensor, state: dict[str, Any] | None = None) -> None:
        learner = self.learner
        x, y = self.training_tensors(x, y)
        lam, mask = learner.grid_models(len(x))
        self.solver = DualCD(learner.energy, x, y, lam, bias_reg=learner.bias_reg, tol=learner.hparams.tol,
                             mask=None if mask is None else mask.cpu())
        if state is not None:
            self.solver.load_state_dict(state)

    def training_step(self, batch: tuple, batch_idx: int) -> None:
        if batch_idx == 0:  # the whole training set: up to solver_iters epochs per training epoch
            self.solver.fit(max_epochs=self.solver.epochs + self.learner.hparams.solver_iters)
            self.step_counter()

    def epoch_end(self) -> bool:
        return self.log_certificate(self.certify())

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.name, **self.solver.state_dict()}

    def report(self) -> dict[str, Any]:
        return super().report() | {"passes": self.solver.epochs}  # DCD epochs ("epochs": the training epochs)


def _counts(oracle: Any) -> dict[str, float]:
    """A counting oracle's searches since its last reset: its ``stats`` and their number."""
    return oracle.stats() | {"searches": oracle.searches}


#: the phrase of ``BCFWStrategy.uncertifiable``'s reason, by which a report's reader (experiments/matrix.py) tells it
#: from a certificate that did not fit the time budget
COULD_NOT_CERTIFY = "so its pass could not certify"


class BCFWStrategy(Certified):
    """Block-coordinate Frank-Wolfe in the SSVM dual (the learner's ``bcfw_oracle``), one step per batch, from
    the learner's ``dual_start`` or w = 0 (a resumed run restores its weights and dual state); the exact gap
    whenever the running estimate says it may certify, and until then up to ``solver_iters`` passes over the
    training set per epoch. The steps take the learner's ``bcfw_step_oracle``, the certificate its ``bcfw_oracle``.
    Oracles that count their searches (``reset`` / ``stats``, e.g. RTA's K-best searches) have them logged each
    epoch and reported: the certificate's (every search where the steps share its oracle) as train/certified and
    train/mean_k under ``inference.train``, the steps' own as train/steps_certified and train/steps_mean_k under
    ``inference.steps``. With pairwise steps (``BCFW``'s active sets) the report names them, with the sets' size
    and the labellings evicted from full sets."""

    name = "bcfw"

    def check(self) -> None:
        super().check()
        learner = self.learner
        if learner.hparams.loss != "hinge" or learner.bcfw_oracle() is None:
            raise ValueError(f"solver=bcfw trains the hinge with an exact or smoothed-LP max; "
                             f"{type(learner).__name__} with loss={learner.hparams.loss} has none: use solver=lbfgs "
                             f"or adam")

    def setup(self, x: torch.Tensor, y: torch.Tensor, state: dict[str, Any] | None = None) -> None:
        learner, hp = self.learner, self.learner.hparams
        self.x, self.y = self.training_tensors(x, y)
        lam, mask = learner.grid_models(len(self.x))
        loaded = [p.detach().clone() for p in learner.energy.parameters()]
        self.solver = BCFW(learner.energy, len(self.x), lam, oracle=learner.bcfw_oracle(),
                           margin_scale=hp.margin_scale, bias_reg=learner.bias_reg, tol=hp.tol, mask=mask,
                           margin=learner.margin, averaging=hp.bcfw_averaging, active_set=hp.bcfw_active_set,
                           step_oracle=learner.bcfw_step_oracle())  # from w = 0 = w(mu) of its starting dual point
        self.search_stats: dict[str, dict[str, float]] = {}  # "train" / "steps": the last epoch's that searched
        self.cheaper_search: str | None = None  # the last certificate's rows searched by the steps' oracle (``_rows``)
        self.step_seconds, self.step_rows, self.warmed_up, self.batch_rows = 0.0, 0, False, 1
        self.rows_stepped = 0  # rows of all steps, the first's included: a pass ends at len(x)
        self.start: dict[str, Any] = {}
        if state is not None:  # the checkpoint's dual state and weights
            self.solver.load_state_dict({k: None if v is None else v.to(learner.device)
                                         for k, v in state.items() if k not in ("kind", "rows_stepped")})
            self.rows_stepped = int(state.get("rows_stepped", len(self.x)))  # older checkpoints: a pass made
            with torch.no_grad():
                for p, saved in zip(learner.energy.parameters(), loaded):
                    p.copy_(saved)
            return
        q = learner.dual_start(self.x, self.y, lam, mask)  # self.y: the labels as the energy holds them
        if q is not None:
            every = torch.arange(len(self.x), device=self.x.device).split(learner.certificate_rows)
            mix = self.solver.start_at(((self.x[i], self.y[i], i) for i in every), q)
            found, dual = self.solver.found_mix, self.solver.dual()
            self.start = {"mix": plain(mix), "line_search": plain(found), "dual": plain(dual)}
            if bool((mix == 0).any()):
                rank_zero_info(f"{type(learner).__name__} (bcfw): the line search keeps {float(found.min()):.2g} of "
                               f"the start at Independent's solution, below {BCFW.MIN_START_MIX}: dropped, from w = 0")

    def epoch_start(self) -> None:
        self.solver.start_epoch()
        for oracle in self._counting_oracles().values():
            oracle.reset()

    def _counting_oracles(self) -> dict[str, Any]:
        """The oracles that count their searches: {"train": the certificate's, "steps": the steps' own}."""
        certificate, steps = self.solver.oracle, self.solver.step_oracle
        oracles = {"train": certificate} | ({"steps": steps} if steps is not certificate else {})
        return {name: o for name, o in oracles.items() if hasattr(o, "stats")}

    def _record_searches(self) -> dict[str, dict[str, float]]:
        """``search_stats`` of the counting oracles that searched since the epoch started; returns those."""
        done = {name: _counts(o) for name, o in self._counting_oracles().items() if o.searches}
        self.search_stats |= done
        return done

    def training_step(self, batch: tuple, batch_idx: int) -> None:
        learner = self.learner
        if len(batch) < 3:
            raise ValueError("solver=bcfw needs batches (x, y, index) with each example's index in the training set")
        if not self.may_step():
            return  # the rest of the epoch passes without steps
        gathered = learner.trainer.world_size > 1  # every rank takes the same step, on the gathered batch
        x, y, index = (learner.all_gather(t).flatten(0, 1) if gathered else t for t in batch[:3])
        self.batch_rows = max(self.batch_rows, len(x))
        info = self.bcfw_step(x, learner.energy_labels(y), index)
        tick(batch_idx + 1, learner.trainer.num_training_batches, "batches", self._pace)
        learner.log("train/loss", info.loss.sum(), prog_bar=True, on_step=False, on_epoch=True, reduce_fx="sum",
                    batch_size=len(x))

    def may_step(self) -> bool:
        """False once the time budget is spent, less the closing certificate's time where it fits and the steps
        have made one pass over the training set: before that pass the budget goes to the steps, for the rows a
        step has not yet reached hold their start, and a certificate of those weights says only how far they are
        (RTA at bookmarks' shape on a loaded machine stopped after 2 of 865 batches to keep the pass's time, and
        predicted its start's 73% subset accuracy, not the 97% of a run that steps). Nor where it could not certify
        (``uncertifiable``): the run then ends without one, saying why."""
        keep = self.rows_stepped >= len(self.x) and self.certificate_fits()
        if out_of_time(reserve=self.certificate_seconds() if keep else 0.0):
            if keep and (why := self.uncertifiable()) is not None:  # no time kept for it: the steps have the budget
                self.unfit = why
                return self.may_step()
            self.reserved = keep
            return False
        return True

    def uncertifiable(self) -> str | None:
        """Why a closing certificate could not certify, where the steps' searches (K-best, counted) of this epoch, or
        of the last epoch that searched, certified none of their rows by Lemma 7: its pass takes those searches (or
        longer ones, which at that many labels rarely certify either), each uncertified row adds its bound's slack
        to the gap, and the gap ends far above model.tol (RTA at bookmarks' shape: 0% certified, bound 1.0, for
        most of a second pass's time). None where they certified some, or are not counted (the tree learners'
        exact max)."""
        oracle = self.solver.step_oracle
        name = next((k for k, counted in self._counting_oracles().items() if counted is oracle), None)
        if name is None:
            return None
        last = _counts(oracle) if oracle.searches else self.search_stats.get(name)
        if last is None or last["certified"] > 0:
            return None
        return (f"not computed: none of the steps' {last['searches']} searches in an epoch was certified (Lemma 7), "
                f"{COULD_NOT_CERTIFY}; the steps had the rest of trainer.time_budget")

    def bcfw_step(self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> StepInfo:
        """One BCFW step on x [B, D], labels [B, n'] as the energy holds them (``energy_labels``), index [B], timed
        for the run's pace."""
        start = time.monotonic()
        info = self.solver.step(x, y, index)
        if self.warmed_up:  # the pace leaves out the run's first step (its warm-up: kernels, allocations)
            self.step_seconds += time.monotonic() - start
            self.step_rows += len(x)
        self.rows_stepped += len(x)
        self.warmed_up = self.stale = True
        self.step_counter()
        return info

    def extra_pass(self, p: int) -> None:
        """Pass ``p`` of the epoch over the training set, in the training batches' size and an order drawn from the
        epoch and ``p`` (the same on every rank), until the time budget (``may_step``) stops it."""
        gap = float(self.solver.gap_estimate().max())  # the last pass's
        seed = self.learner.current_epoch * self.learner.hparams.solver_iters + p
        for i in self.solver.start_pass(self.batch_rows, torch.Generator().manual_seed(seed), self.x.device):
            if not self.may_step():
                return
            self.bcfw_step(self.x[i], self.y[i], i)
            tick(p + 1, self.learner.hparams.solver_iters, "passes", lambda: f"{self._pace()}, gap estimate {gap:.2g}")

    def _pace(self) -> str:
        return f"{self.step_rows / self.step_seconds:.0f} rows/s" if self.step_seconds > 0 else ""

    def certificate_seconds(self) -> float:
        """The closing certificate's expected time (one pass of the oracle over the training set) at the pace of
        this run's steps after its first (0 until then): the time budget keeps it in reserve where it fits, else
        the steps run to the end of the budget and the run ends without a certificate."""
        return self.step_seconds / self.step_rows * len(self.x) if self.step_rows else 0.0

    def epoch_end(self) -> bool:
        """The exact gap where the running estimate says it may certify; until then, more passes over the training
        set (``extra_pass``), up to ``solver_iters`` passes in the epoch, as L-BFGS and DCD run up to ``solver_iters``
        iterations per epoch. Once the estimate says it may certify, the epoch ends whatever the certificate says:
        where the primal is a loose bound (RTA's uncertified K-best searches) more passes do not close the gap (flags:
        an estimate of 3e-5 against a certified 9e-3), and a stalled oracle's estimate can be <= 0 (birds)."""
        info = self.certificate_if_due()
        for p in range(1, self.learner.hparams.solver_iters):
            if (info is not None and bool(info.converged.all())) or self.solver.should_certify():
                break
            if not self.may_step():  # the budget is spent, or the steps stopped to keep the certificate's time
                if info is None and self.reserved:  # the latter before it was computed: now, and if cut the steps go on
                    info = self.certificate_if_due()
                if not self.may_step():
                    break
            self.extra_pass(p)
            info = self.certificate_if_due()
        for name, stats in self._record_searches().items():
            prefix = "" if name == "train" else f"{name}_"
            self.learner.log(f"train/{prefix}certified", stats["certified"])
            self.learner.log(f"train/{prefix}mean_k", stats["mean_k"])
        if info is None:
            self.learner.log("train/duality_gap", self.solver.gap_estimate().max().float(), prog_bar=True)
            return False
        return self.log_certificate(info)

    def certificate_if_due(self) -> GapInfo | None:
        """The exact gap (``certify``) where it fits the budget and the running estimate says it may certify, or the
        steps stopped to keep its time (``reserved``: the closing certificate, computed at once); never where it
        could not certify (``uncertifiable``: RTA at corel5k's shape spent three passes of 35 s on certificates
        whose searches certified none). A closing pass cut at the budget (``unfit``: slower than the steps, RTA on
        delicious) gives the steps back the time it kept."""
        if not ((self.solver.should_certify() or self.reserved) and self.certificate_fits()) or self.uncertifiable():
            return None
        info = self.certify()
        if info is None:  # the pass was cut (``unfit``): the steps may use the time it kept
            self.reserved = False
        return info

    def certify(self) -> GapInfo | None:
        """The exact duality gap, one pass over the training set (a progress line every ``EVERY_S`` seconds of a
        long pass). K-best searches that double K for uncertified rows can make the pass many times slower than the
        steps (RTA on delicious: 14 rows/s against 130): once the pass's own pace says it would end past the time
        budget by more than its grace (``certificate_grace``; ``certificate_seconds``: from the steps' pace), the rest
        of its rows take the steps' search (``_rows``; a looser bound, still an upper one: ``cheaper_search`` says
        how many rows). None, with ``unfit`` saying why, where that too would end past it even at the steps' pace
        (``_rows``): the steps then have the budget left."""
        every, escalated = torch.arange(len(self.x), device=self.x.device), self.solver.escalated
        self.cheaper_search = None
        with phase(f"{type(self.learner).__name__} ({self.name}) certificate", quiet=True):
            try:
                info = self.solver.duality_gap(self._rows(every))
            except OutOfTime as err:
                self.unfit = f"not computed: {err}"
                return None
        self._record_searches()
        if self.cheaper_search is not None:
            rank_zero_info(f"{type(self.learner).__name__} (bcfw) certificate: {self.cheaper_search}")
        if self.solver.escalated and not escalated:
            rank_zero_info(f"{type(self.learner).__name__} (bcfw): the certificate's search found violators that the "
                           f"steps' cheaper one does not (a relative gap above model.tol): the steps take the "
                           f"certificate's search from now on")
        return info

    def _rows(self, every: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
        """The certificate's batches (x, y, index, oracle) of the row indices ``every`` [N], oracle None (the
        certificate's; ``certificate_rows`` a batch) until the pace since its first batch (a warm-up, left out as the
        steps' pace leaves out their first step: RTA on tmc2007 cut a pass whose first 1024 rows took 2.7 s, at a pace
        that put its end 20 s past the budget with 28 s left) says it would end more than its grace past the time
        budget; from then on the steps' own (where they have a cheaper one, ``step_search_rows``
        a batch; ``cheaper_search``), and OutOfTime once it would end past that even at the faster of its pace since
        then and the steps' (their search, which the steps timed: a load on the machine that slowed its first batches,
        and has passed, does not cut a pass that the budget holds at the steps' pace; delicious lost its certificate
        so)."""
        done, start, grace = 0, time.monotonic(), self.certificate_grace()
        oracle, since, at, N, rows = None, start, 0, len(self.x), self.learner.certificate_rows
        step_pace = self.certificate_seconds() / N  # seconds a row (0: unknown)
        while done < N:
            i = every[done:done + rows]
            tick(done, N, "rows")
            if at == 0 < done and oracle is None:  # the pace leaves out the first batch (warm-up), as the steps' does
                since, at = time.monotonic(), done
            took = time.monotonic() - since
            pace = took / (done - at) if done > at else 0.0  # since ``since``
            if oracle is not None and step_pace > 0:
                pace = min(pace, step_pace)
            if done > at and out_of_time(reserve=pace * (N - done) - grace):
                if oracle is not None or self.solver.step_oracle is self.solver.oracle:
                    raise OutOfTime(f"its pass over the training set would end more than {grace:.0f} s past "
                                    f"trainer.time_budget ({done} of {N} rows in {time.monotonic() - start:.0f} s)")
                oracle, since, at = self.solver.step_oracle, time.monotonic(), done
                i = every[done:done + (rows := self.learner.step_search_rows)]
                self.cheaper_search = (f"the steps' search (K not doubled) on the last {N - done} of {N} rows: with "
                                       f"K doubled the pass would have ended more than {grace:.0f} s past "
                                       f"trainer.time_budget ({done} rows in {took:.0f} s)")
            yield self.x[i], self.y[i], i, oracle
            done += len(i)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.name, "rows_stepped": self.rows_stepped,
                **{k: None if v is None else v.detach().cpu() for k, v in self.solver.state_dict().items()}}

    def report(self) -> dict[str, Any]:
        report = super().report() | ({"start": self.start} if self.start else {})
        report |= {"steps_escalated": True} if self.solver.escalated else {}
        report |= {"cheaper_search": self.cheaper_search} if self.cheaper_search else {}
        sets = self.solver.active_sets  # pairwise steps: the labellings held per row, those evicted from full sets
        report |= {"steps": "pairwise", "active_set": sets.size, "evictions": self.solver.evictions} if sets else {}
        return report | ({"inference": self.search_stats} if self.search_stats else {})


def lbfgs_solver(learner, energy, x: torch.Tensor, labels: torch.Tensor, lam: float | torch.Tensor,
                 mask: torch.Tensor | None, tol: float | None = None, dtype: torch.dtype | None = None
                 ) -> SmoothedLBFGS:
    """The ``SmoothedLBFGS`` of ``learner``'s objective (its loss, margin, bias_reg and tol, unless ``tol`` is given)
    for ``energy`` on x [N, D], labels [N, n], at lambda ``lam`` (a float or [M]) on the rows ``mask`` [M, N] (None:
    all); in ``dtype`` (None: ``lbfgs_dtype``'s precision)."""
    hp = learner.hparams
    crf = hp.loss == "crf"
    return SmoothedLBFGS(energy, x, labels, lam, smoothed_max=learner.smoothed_max(),
                         margin_scale=0.0 if crf else hp.margin_scale, bias_reg=learner.bias_reg,
                         tol=hp.tol if tol is None else tol, eps=1.0 if crf else None, mask=mask,
                         dtype=dtype or lbfgs_dtype(len(x), energy.graph, lam.numel() if torch.is_tensor(lam) else 1))


def lbfgs_dtype(rows: int, graph: Graph, models: int = 1) -> torch.dtype:
    """What L-BFGS computes in for ``models`` models on ``graph`` over ``rows`` examples: float32 above
    ``FLOAT32_ABOVE`` potential entries N (n + E) K^2 M (K = 2), else float64."""
    entries = rows * (graph.num_nodes + graph.num_edges) * models * 4
    return torch.float32 if entries > FLOAT32_ABOVE else torch.float64


def plain(t: torch.Tensor) -> float | bool | list:
    """A per-model tensor [M] as a JSON value: a scalar for one model, else a list."""
    values = t.detach().cpu().tolist()
    return values[0] if len(values) == 1 else values
