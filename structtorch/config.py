"""Structured (dataclass) configs for Hydra: a typo in a key, or a value of the wrong type, fails before training.

Each YAML file under ``conf/`` extends one of the schemas registered here (``defaults: [/<schema>@_here_]``).
``describe_config_error`` turns Hydra's composition errors into the one line the CLI prints.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import MISSING, DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from .data.download import mulan_datasets

__all__ = ["Config", "DenoisingDataConfig", "HorsesDataConfig", "ModelConfig", "FixedTreeConfig", "FullConfig",
           "LogisticConfig", "MAMConfig", "MulanDataConfig", "RTAConfig", "SyntheticDataConfig", "TrainerConfig",
           "TreeCRFConfig", "TreeCRFSyntheticDataConfig", "SCHEMAS", "describe_config_error", "register_configs"]


@dataclass
class ModelConfig:
    """Common learner options (see ``StructuredLearner``)."""

    name: str = MISSING  # key of structtorch.learners.LEARNERS
    loss: str = "hinge"
    train_inference: str = "tree_map"
    test_inference: str = "tree_map"
    l2: Any = "auto"  # auto: the learner's auto_l2 / N; a number; or a list: a grid chosen by cv_folds-fold CV
    cv_folds: int = 5
    cv_metric: str = "hamming_acc"
    # lbfgs | bcfw | dcd (certified: stop at tol) | adam | adamw | sgd; auto: lbfgs if certified (Independent: dcd)
    solver: str = "auto"
    lr: float = 0.01
    lr_schedule: str = "cosine"
    tol: float = 1e-3  # relative duality gap at which a certified solver stops
    bias_reg: Any = "auto"  # the bias's regulariser relative to l2; auto: 1 for bcfw, else 1e-4
    solver_iters: int = 200  # per epoch at most: L-BFGS iterations, DCD epochs or BCFW passes
    margin: str = "hamming"  # hamming (M3N) | zero_one (margin against the worst violator; solver bcfw or adam)
    margin_scale: float = 1.0
    bcfw_averaging: bool = False  # solver=bcfw: certify (and predict with) the weighted average of the iterates
    # solver=bcfw: pairwise steps with up to this many labellings per training row (0: Frank-Wolfe steps); auto: 32
    # (fewer where memory or the steps' cost needs it) where the blocks are whole rows and the oracle returns labellings
    bcfw_active_set: Any = "auto"


@dataclass
class M3NConfig(ModelConfig):
    """Learners of the Finley-Joachims energy (independent, fixed_tree, greedy, mst, full, crank, project)."""

    spin: bool = True  # pairwise w_ij s_i s_j on spins s = 2y - 1 (Ising); false: w_ij y_i y_j
    # full, crank, project, greedy, mst choose among each label's `candidates` most dependent partners (mutual
    # information); complete graph while n <= 2 candidates + 1, or with null
    candidates: Any = 10
    independent_start: bool = True  # lbfgs on a graph with edges starts at Independent's solution, couplings 0


@dataclass
class FixedTreeConfig(M3NConfig):
    """FixedTree: ``tree`` is "chow_liu" (max spanning tree of label mutual information on the
    training labels), "chain", "star" or "empty"."""

    tree: str = "chow_liu"


@dataclass
class SearchConfig(M3NConfig):
    """MST and Greedy: the structure search trains on at most ``search_rows`` training rows (a seeded subset;
    null: all of them); the forest it chooses trains on every row."""

    search_rows: Any = 2000


@dataclass
class GreedyConfig(SearchConfig):
    """Greedy: candidates of a step ranked after ``search_iters`` L-BFGS iterations from the current forest."""

    search_iters: int = 50


@dataclass
class FullConfig(M3NConfig):
    """Full: complete graph, smoothed-LP hinge; test_inference "smoothed_lp" or "lp_map"."""

    test_inference: str = "smoothed_lp"
    eps: float = 0.01
    iters: int = 20
    lp_tol: float = 1e-2  # a smoothed-LP call's sweeps stop at a dual decrease below lp_tol * eps
    predict_eps: float = 0.005
    predict_iters: int = 300


@dataclass
class CRANKConfig(FullConfig):
    """CRANK: circuit-rank regularised CCCP on the complete graph until the support is a forest."""

    beta: float = 1e-3
    beta_growth: float = 2.0
    cccp_tol: float = 1e-3
    inner_iters: int = 100
    restarts: int = 10
    init_scale: float = 0.1
    seed: int = 0
    eps: float = 0.005  # the smoothing's bias grows with the complete graph's edges (README, CRANK)
    search_rows: Any = 2000  # CCCP searches on at most this many training rows; its forest trains on every row


@dataclass
class TreeCRFConfig(ModelConfig):
    """TreeCRF: max spanning tree of edge scores, then a tree CRF on local inputs by likelihood."""

    loss: str = "crf"
    test_inference: str = "auto"  # auto (held-out choice) | tree_mpm (Hamming) | tree_map (subset 0/1) | tree_f1 (F1)
    score: str = "dci"  # piecewise | local_cmi | dci | global_cmi | chow_liu
    inputs: str = "l1"  # l1 (top num_inputs columns of an l1 regression per label) | aligned (column i -> label i)
    num_inputs: int = 10
    local_unary: bool = False  # unary factors on the label's inputs only (True) or on all inputs
    num_states: int = 2
    score_folds: int = 5  # CV folds choosing each edge-score regression's l2 penalty
    candidates: Any = 10  # scores for each label's `candidates` most dependent partners; complete graph while small
    score_rows: Any = 2000  # int or None: inputs and edge scores from at most this many training rows (seeded subset)
    cv_folds: int = 3  # model.l2=auto: lambda by cv_folds-fold CV on at most score_rows rows (TreeCRF.choose_l2)


@dataclass
class RTAConfig(ModelConfig):
    """RTA: max-margin ensemble of random spanning trees (BCFW, K-best inference with Lemma 7's certificate)."""

    num_trees: int = 10
    k: int = 8
    k_max: Any = None  # int or None: max(k, min(2 * number of labels, 32))
    exact_labels: int = 22  # up to this many labels inference scores every labelling (exact), above it K-best lists
    seed: int = 0
    normalize: Any = "auto"  # row (x / |x|, the paper's) | global (x / rms row norm) | false | auto: CV of Independent
    margin: str = "hamming"  # hamming (margin = Hamming distance) | zero_one (Def. 6: 1 against the worst violator)
    bias_reg: float = 1.0
    independent_start: bool = True  # BCFW starts at the dual point of Independent's solution (product distributions)
    interaction_l2: Any = "auto"  # edge tables' x-dependent interaction's l2: 1 (paper's), inf (none), auto (CV)


@dataclass
class MAMConfig(ModelConfig):
    """MAM: random spanning-tree M3Ns trained separately, max-marginals averaged (RTA's comparison point)."""

    num_trees: int = 10
    seed: int = 0
    independent_start: bool = True  # every tree starts at Independent's solution, its edge tables 0
    edge_l2: float = 4.0  # the edge tables' l2 weight relative to the node tables' (learners.rta.EDGE_L2)


@dataclass
class LogisticConfig(ModelConfig):
    """LogisticEnergy (Domke 2013): grid energies by message-biased logistic regression (``data=denoising``,
    ``data=horses``).

    unary / pairwise: zero | const | linear | boost (xgboost; one tree per state per fit) | mlp;
    method: logistic (Algorithm 1) | hinge (end to end, solver adam / adamw / sgd). l2: 0 (the paper's objective has
    no regulariser); method=hinge may set it.
    """

    l2: Any = 0.0
    test_inference: str = "smoothed_lp"
    unary: str = "linear"
    pairwise: str = "linear"
    method: str = "logistic"
    eps: float = 0.1
    passes: int = 25  # message passes after each fit (paper: 25)
    predict_iters: int = 100
    predict_eps: Any = None  # float or None (= eps)
    fit_iters: int = 50  # L-BFGS iterations per fit (const, linear)
    hidden: int = 20  # MLP hidden units
    unary_lr: float = 0.25  # MLP SGD steps (paper: .25 unary, .05 pairwise)
    pairwise_lr: float = 0.05
    fit_epochs: int = 5  # MLP SGD passes over the positions per fit
    seed: int = 0


@dataclass
class MulanDataConfig:
    """Any Mulan dataset by name (``data=mulan data.name=<dataset>``), see ``MultilabelDataModule``.

    root None: the verified download cache ``$STRUCTTORCH_DATA/mulan/<name>`` (default
    ``~/.cache/structtorch``), filled from ``url`` (None: the Mulan GitHub repository at a pinned
    commit) on first use. root=<dir>: a local copy ``<dir>/<name>/<name>-train.arff, -test.arff, .xml``.
    """

    kind: str = "mulan"
    name: str = MISSING
    root: Any = None
    url: Any = None
    batch_size: int = 64
    val_fraction: float = 0.1
    seed: int = 0
    num_folds: Any = None  # int or None: k-fold over fold_pool
    fold: int = 0
    fold_pool: str = "train+test"  # or "train": cross-validation on the training file (the test file unused)
    num_workers: int = 0
    standardize: bool = True
    test_fraction: float = 0.3
    label_attributes: Any = None  # int or None: labels = last L attributes when there is no XML
    max_labels: Any = None  # int or None: keep the L most frequent labels of the training file
    max_rows: Any = None  # int or None: a seeded random subset of the training file's rows


@dataclass
class GeneratedDataConfig:
    """Options shared by the generated datasets (no files needed)."""

    batch_size: int = 64
    val_fraction: float = 0.1
    seed: int = 0
    num_folds: Any = None
    fold: int = 0
    num_workers: int = 0
    standardize: bool = False


@dataclass
class SyntheticDataConfig(GeneratedDataConfig):
    """The synthetic CRANK data (no files needed)."""

    kind: str = "synthetic"
    num_train: int = 1000
    num_test: int = 1000
    num_labels: int = 10
    num_features: int = 4
    pairwise_scale: Any = None
    pairwise_mean: float = 0.0


@dataclass
class TreeCRFSyntheticDataConfig(GeneratedDataConfig):
    """The synthetic tree-CRF data of Bradley & Guestrin (ICML 2010), see ``tree_crf_synthetic`` (no files)."""

    kind: str = "tree_crf_synthetic"
    num_train: int = 500
    num_test: int = 1000
    num_labels: int = 40
    structure: str = "tree"  # tree | chain
    factors: str = "associative"  # associative | random
    strengths: Any = field(default_factory=lambda: [4.0, 2.0, 1.0])  # log-space strengths (Y-Y, Y-X, X-X)
    alternating: bool = True
    cross: bool = True
    cross_strength: Any = None  # float or None: the Y-X strength
    joint: str = "intractable"  # intractable | tractable


@dataclass
class DenoisingDataConfig:
    """Domke's synthetic binary denoising images (per-pixel labels on a 4-connected grid, no files needed)."""

    kind: str = "denoising"
    num_train: int = 16
    num_test: int = 16
    height: int = 100
    width: int = 100
    blur: float = 10.0  # std (pixels) of the Gaussian that smooths the uniform noise into the labels
    batch_size: int = 16
    val_fraction: float = 0.0
    seed: int = 0
    num_workers: int = 0


@dataclass
class HorsesDataConfig:
    """Figure/ground segmentation of photographs (``SegmentationDataModule``): the Weizmann horses of Domke's
    experiment from the data cache (root None), or any folder of images and masks (``data.root``)."""

    kind: str = "segmentation"
    name: str = "horses"
    root: Any = None  # None: $STRUCTTORCH_DATA/horses; a folder with <images>/ + <masks>/, or train/ + test/
    images: str = "rgb"  # the subfolders of colour images and of their masks (same file name stems)
    masks: str = "figure_ground"
    height: int = 45  # the grid every image and mask is resized to (chosen on validation images: README)
    width: int = 60
    hog_cell: int = 6  # HOG cell side, in grid pixels (a block: 2 x 2 cells)
    threshold: int = 128  # mask grey level from which on a pixel is figure
    test_fraction: float = 0.3  # seeded test share of a <images>/ + <masks>/ folder (train/ + test/: fixed)
    batch_size: int = 16
    val_fraction: float = 0.0
    seed: int = 0
    num_workers: int = 0


@dataclass
class TrainerConfig:
    """Options passed to ``lightning.Trainer`` (a subset; add more as needed)."""

    accelerator: str = "cpu"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    max_epochs: int = 60
    precision: str = "32-true"
    log_every_n_steps: int = 10
    deterministic: bool = False
    enable_progress_bar: bool = True
    enable_checkpointing: bool = True
    gradient_clip_val: Any = None
    num_threads: Any = "auto"  # torch intra-op threads: auto = the cores other processes leave free; an int; null =
    # torch's default (one per core). Not a lightning.Trainer option.
    time_budget: Any = 540  # seconds of wall clock for the fit (structure learning included): training stops there,
    # certified or saying it is not; null: no budget. Not a lightning.Trainer option.


@dataclass
class Config:
    model: Any = MISSING
    data: Any = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    seed: int = 0
    ckpt_path: Any = None  # resume from this checkpoint file, or "last" (newest last.ckpt under the output folder)
    resume: Any = None  # resume from <run dir>/checkpoints/last.ckpt
    logger: str = "tensorboard"  # "tensorboard", "csv" or "none"
    test: bool = True
    fused: Any = "auto"  # tree ops and smoothed LP of CPU tensors by the fused C++ kernels: auto = on a CPU run
    # where they build (built once, cached; else the eager passes with one warning); true (an error where they cannot
    # be built); false = the eager passes


#: the schemas the YAML files of ``conf/`` extend (``defaults: [/<name>@_here_]``), stored at the root of the
#: config store so that they are no options of a group (``--help``, "could not find" lists)
SCHEMAS: dict[str, type] = {
    "config_schema": Config, "model_schema": ModelConfig, "m3n_schema": M3NConfig,
    "fixed_tree_schema": FixedTreeConfig, "search_schema": SearchConfig, "greedy_schema": GreedyConfig,
    "full_schema": FullConfig,
    "crank_schema": CRANKConfig, "tree_crf_schema": TreeCRFConfig, "rta_schema": RTAConfig, "mam_schema": MAMConfig,
    "logistic_schema": LogisticConfig, "mulan_schema": MulanDataConfig, "synthetic_schema": SyntheticDataConfig,
    "tree_crf_synthetic_schema": TreeCRFSyntheticDataConfig, "denoising_schema": DenoisingDataConfig,
    "horses_schema": HorsesDataConfig, "trainer_schema": TrainerConfig,
}


def register_configs() -> None:
    """Store the schemas (``SCHEMAS``) and one ``data=<name>`` option per Mulan catalog dataset."""
    cs = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        cs.store(name=name, node=schema)
    for name in mulan_datasets():  # data=<name> for every dataset of the Mulan catalog
        cs.store(group="data", name=name, node=MulanDataConfig(name=name))


def describe_config_error(err: Exception) -> str:
    """One line for a Hydra composition error: an unknown option (with the closest one and the choices) or key
    (with the closest valid key), a value of the wrong type with its key, an override that does not parse; any
    other error's message (and its cause's) on one line."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        group, _, option = err.missing_cfg_file.rpartition("/")
        return f"unknown {group} {option!r}{_closest(option, err.options)} (choices: {', '.join(err.options)})"
    if isinstance(err, OverrideParseException):
        return f"cannot parse the override {err.override!r}: {_first_line(err.message)}"
    cause = err.__cause__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and isinstance(cause.parent_node, DictConfig):
        keys = [str(k) for k in cause.parent_node.keys()]
        within = cause.full_key.rpartition(".")[0]
        close = _closest(str(cause.key), keys, f"{within}." if within else "")
        return f"unknown key {cause.full_key!r}" + (close or f" (valid keys{' of ' + within if within else ''}: "
                                                              f"{', '.join(keys)})")
    if isinstance(cause, ValidationError) and cause.full_key:
        return f"bad value for {cause.full_key}: {_first_line(str(cause))}"
    return "; ".join(" ".join(str(e).split()) for e in (err, cause) if e is not None and str(e).strip())


def _closest(given: str, valid: list[str], prefix: str = "") -> str:
    """``; did you mean '<prefix><closest>'?``, or "" when no valid name is close to ``given``."""
    close = difflib.get_close_matches(given, list(valid), n=1, cutoff=0.6)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0]
