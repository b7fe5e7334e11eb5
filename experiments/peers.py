"""The scikit-learn peers a user would otherwise pick, on the same splits and standardisation as structtorch's
datamodules: binary relevance with LinearSVC (``br_linear_svc``) and an ensemble of classifier chains of logistic
regressions (``ecc``), each with C chosen by k-fold CV (Hamming accuracy) on the training file, on the package's
folds (``structtorch.data.kfold_indices``, seed 0); above ``CV_ALL_LABELS`` labels the CV scores a seeded sample of
labels."""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch
from runner import choose_by_cv
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.multioutput import ClassifierChain
from sklearn.svm import LinearSVC
from tables import curve, percents

from structtorch.data import Standardizer, kfold_indices, load_mulan
from structtorch.metrics import multilabel_scores

C_GRID = [0.01, 0.1, 1.0, 10.0]
#: above ``CV_ALL_LABELS`` labels (the matrix's large datasets), C is chosen by CV on ``CV_LABELS`` labels drawn with
#: seed 0 (all of delicious's 983 labels x 13 fits would take about 10 hours on 2 cores: 0.8 s a LinearSVC fit at
#: C = 0.01, 12.7 s at C = 1); the final fit trains every label
CV_ALL_LABELS, CV_LABELS = 160, 20
PEERS = ("sklearn BR-LinearSVC", "sklearn ECC")


def standardized(data: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, x_test, y_test) of a Mulan dataset, features standardised by the training file's statistics with
    the datamodules' ``Standardizer`` (constant columns map to 0, missing values to the training mean)."""
    (x, y), (xt, yt) = load_mulan(data, "train")[:2], load_mulan(data, "test")[:2]
    scale = Standardizer.fit(x)
    return scale.transform(x).numpy(), y.numpy(), scale.transform(xt).numpy(), yt.numpy()


def fit_br_linear_svc(x: np.ndarray, y: np.ndarray, C: float) -> OneVsRestClassifier:
    """One LinearSVC (liblinear, squared hinge, sklearn's defaults) per label; a label constant in ``y`` predicts
    its constant."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (ConvergenceWarning, UserWarning))
        return OneVsRestClassifier(LinearSVC(C=C)).fit(x, y)


def fit_ecc(x: np.ndarray, y: np.ndarray, C: float, seed: int = 0) -> list[ClassifierChain]:
    """10 classifier chains of logistic regressions, random label orders."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (ConvergenceWarning, UserWarning))
        return [ClassifierChain(LogisticRegression(C=C, max_iter=2000), order="random", random_state=seed + i)
                .fit(x, y) for i in range(10)]


def predict(model: OneVsRestClassifier | list[ClassifierChain], x: np.ndarray) -> np.ndarray:
    """0/1 predictions [N, L]: BR's decisions, or the chains' averaged probabilities thresholded at 0.5."""
    if isinstance(model, list):
        return np.mean([c.predict_proba(x) for c in model], 0) >= 0.5
    return model.predict(x)


FITS = {"sklearn BR-LinearSVC": fit_br_linear_svc, "sklearn ECC": fit_ecc}


def run_peer(name: str, data: str, folds: int = 3) -> dict:
    """Test scores (%) of peer ``name`` with C by ``folds``-fold CV on the training file, its CV curve and the
    seconds of the whole procedure (CV and final fit)."""
    fit = FITS[name]
    x, y, xt, yt = standardized(data)
    splits = [[i.numpy() for i in kfold_indices(len(x), folds, k, seed=0)] for k in range(folds)]
    labels = cv_labels(y.shape[1])

    def scores(C: float) -> list[float]:
        return [_scores(predict(fit(x[tr], y[tr][:, labels], C), x[va]), y[va][:, labels])["hamming_acc"]
                for tr, va in splits]

    t0 = time.perf_counter()
    C, cv = choose_by_cv(C_GRID, scores)
    model = fit(x, y, C)
    seconds = time.perf_counter() - t0
    return {"C": C, "cv": curve(C_GRID, [100 * a for a in cv]), **percents(_scores(predict(model, xt), yt)),
            "train_seconds": seconds, "cv_labels": len(labels), "num_labels": y.shape[1]}


def cv_labels(n: int) -> np.ndarray:
    """The labels C's CV scores: all n, or above ``CV_ALL_LABELS`` labels ``CV_LABELS`` of them drawn with seed 0."""
    if n <= CV_ALL_LABELS:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).choice(n, CV_LABELS, replace=False))


def _scores(y_hat: np.ndarray, y: np.ndarray) -> dict[str, float]:
    return multilabel_scores(torch.from_numpy(np.asarray(y_hat)).long(), torch.from_numpy(y))
