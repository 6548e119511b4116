"""``learn=EMB``: the cascade's cheap score refined on the judge's own sample, before the band is placed.

The judge scores a uniform random sample anyway (to fit the mapping and the cut). Those same calls teach a linear
head: a ridge regression (scikit-learn ``RidgeCV``, standardised inputs) of the judge's score on the unit's stored CLIP
vectors (the student's features, :func:`halsift.filtering.detectors.student.features`: image, sentence, their
product, their cosine) and the cheap score. The refined score ``head(vectors) + cheap_coef * cheap`` replaces the
cheap score everywhere the plan reads it (the cut, the band, the map); no judge call is added.

The head is saved as a linear ``student`` (``OUT/_cascade/student``) so that every unit gets its vectors' part the
way any detector scores: the corpus from the embeddings folder ``EMB`` (a ``halsift embed`` folder of the corpus),
calibration units through the frozen plan encoded on the fly by the CLIP that made ``EMB``.

The plan is fitted on out-of-fold refined scores of the sample (5 folds by caption): the sample's in-fold
predictions would look more like the judge than the rest of the corpus does.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from halsift.corpus.errors import InputError

MIN_UNITS = 50  # judged sample units below which a head on 3 * dim + 2 inputs is not fitted
ALPHAS = tuple(float(a) for a in np.logspace(-2, 4, 13))  # ridge penalties tried (leave-one-out, RidgeCV)
FOLDS = 5
STUDENT = "student"  # the head's folder inside the plan's folder


@dataclass
class Learned:
    """What the plan keeps of the head: the cheap score's weight (the vectors' part is the student's output)."""

    cheap_coef: float
    student: str
    embeddings_model: str
    sample_units: int
    alpha: float
    cheap_spearman: float  # the cheap score's Spearman correlation with the judge on the sample
    learned_spearman: float  # the refined score's, out of fold

    def to_json(self) -> dict:
        return asdict(self)


def sample_vectors(emb: str | Path, keys: list[str], idx: np.ndarray, mask: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, str]:
    """(image vectors, sentence vectors, model) of the ``mask``-ed units, read part by part from ``emb``; a unit
    without vectors is an error naming it (``EMB`` must hold the corpus the cascade scores)."""
    from halsift.corpus.embedding_store import IMAGE, iter_embeddings, read_manifest

    want = {(k, int(i)) for k, i, m in zip(keys, idx, mask) if m}
    images = {k for k, _ in want}
    img, txt = {}, {}
    for part in iter_embeddings(emb, None):
        for k, i, v in zip(part.keys, part.sentence_index, part.vectors):
            if i == IMAGE and k in images:
                img[k] = v
            elif (k, int(i)) in want:
                txt[(k, int(i))] = v
    missing = next(((k, i) for k, i in sorted(want) if k not in img or (k, i) not in txt), None)
    if missing:
        raise InputError(f"cascade: learn={emb} has no vectors for unit {missing[0]!r} sentence {missing[1]} "
                         "(embed the shards the cascade scores: halsift embed --data SHARDS --out EMB)")
    order = [(k, int(i)) for k, i, m in zip(keys, idx, mask) if m]
    return (np.stack([img[k] for k, _ in order]).astype(np.float32),
            np.stack([txt[u] for u in order]).astype(np.float32), read_manifest(emb)["model"])


def _pipeline(alphas=ALPHAS):
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    # a fresh array each time: RidgeCV writes into its alphas
    return make_pipeline(StandardScaler(), RidgeCV(alphas=np.array(alphas, np.float64)))


def fit_head(feats: np.ndarray, cheap: np.ndarray, judge: np.ndarray, groups: np.ndarray
             ) -> tuple[np.ndarray, float, float, np.ndarray, float]:
    """Ridge of ``judge`` on ``[feats, cheap]``: ``(weights on feats, bias, cheap_coef, out-of-fold predictions,
    alpha)``, the weights folded back to raw (unstandardised) inputs, so that ``feats @ w + bias + cheap_coef *
    cheap`` is the model's prediction."""
    from sklearn.model_selection import GroupKFold

    x = np.concatenate([feats, np.asarray(cheap, np.float64)[:, None]], 1)
    y = np.asarray(judge, np.float64)
    if len(y) < MIN_UNITS:
        raise InputError(f"cascade: learn= fits its head on the judged sample, which holds {len(y)} units "
                         f"(at least {MIN_UNITS} needed): raise budget or sample, or drop learn=")
    model = _pipeline().fit(x, y)
    scaler, ridge = model.steps[0][1], model.steps[1][1]
    w = ridge.coef_ / scaler.scale_
    bias = float(ridge.intercept_ - (w * scaler.mean_).sum())
    oof = np.empty(len(y))
    folds = min(FOLDS, len(np.unique(groups)))
    for tr, te in GroupKFold(folds).split(x, groups=groups):
        oof[te] = _pipeline((float(ridge.alpha_),)).fit(x[tr], y[tr]).predict(x[te])
    return w[:-1], bias, float(w[-1]), oof, float(ridge.alpha_)


def write_student(folder: Path, weights: np.ndarray, bias: float, dim: int, model: str) -> None:
    """The vectors' part of the head as a linear ``student`` (its score is the head's output, not a sigmoid)."""
    import torch
    from safetensors.torch import save_file

    from halsift.corpus.shards import write_json_atomic
    from halsift.filtering.detectors.student import FORMAT

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".model.{os.getpid()}.safetensors"  # atomic: every rank or task of a launch writes the same head
    save_file({"weight": torch.tensor(weights, dtype=torch.float32)[None, :].contiguous(),
               "bias": torch.tensor([bias], dtype=torch.float32)}, str(tmp))
    os.replace(tmp, folder / "model.safetensors")
    write_json_atomic(folder / "config.json", {"format": FORMAT, "dim": dim, "hidden": 0, "output": "linear",
                                               "embeddings_model": model, "fitted_by": "cascade learn="})


def learn(emb: str | Path, keys: list[str], idx: np.ndarray, groups: np.ndarray, sampled: np.ndarray,
          cheap: np.ndarray, judge_sample: np.ndarray, plan_dir: Path) -> tuple[Learned, np.ndarray]:
    """Fit the head on the judged sample and write its student into ``plan_dir``; returns what the plan keeps and
    the sample's out-of-fold refined scores (in the sample's order)."""
    from scipy.stats import spearmanr

    from halsift.filtering.detectors.student import features

    img, txt, model = sample_vectors(emb, keys, idx, sampled)
    c = np.asarray(cheap, np.float64)[sampled]
    j = np.asarray(judge_sample, np.float64)
    w, bias, coef, oof, alpha = fit_head(features(img, txt).astype(np.float64), c, j, groups[sampled])
    write_student(plan_dir / STUDENT, w, bias, img.shape[1], model)
    rho = lambda a: float(spearmanr(a, j).statistic) if len(j) > 2 else float("nan")  # noqa: E731
    return Learned(coef, STUDENT, model, int(sampled.sum()), alpha, rho(c), rho(oof)), oof


def student_spec(plan_dir: Path, learned: dict, embeddings: str | None) -> str:
    """The student of a plan's head: on the corpus from ``embeddings``, elsewhere encoding each unit."""
    spec = f"student:path={Path(plan_dir) / learned['student']}"
    return spec + (f",embeddings={embeddings}" if embeddings else "")


def refined(student_scores: np.ndarray, cheap: np.ndarray, learned: dict) -> np.ndarray:
    """The refined cheap score: the head's vectors part plus its cheap part."""
    return np.asarray(student_scores, np.float64) + float(learned["cheap_coef"]) * np.asarray(cheap, np.float64)


__all__ = ["Learned", "fit_head", "learn", "refined", "sample_vectors", "student_spec", "write_student"]
