"""The likelihood section of ``eval bench`` (HalDec-Bench Fig. 7): per-sentence log-likelihood under a VLM judge's
language model given the sentence's own image or a random other image of the bench, by position and label.

Per labelled bench row, :func:`likelihood_table` reads the mean token log-likelihood (nats/token) of the sentence
after the caption's preceding sentences (:func:`halsift.filtering.detectors.vlm_likelihood.sentence_logliks`), once with
the row's own image and once with another image of the bench (a seeded derangement over the images).

Metric keys (``<k>`` = 0-based position): ``likelihood/{own,random,gap}/pos<k>|all`` over labelled rows and
``likelihood/{own,random,gap}/{correct,incorrect}/pos<k>|all`` per label (``gap`` = own − random), and
``likelihood/n/{correct,incorrect}``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import numpy as np
import pandas as pd

LABELS = ("correct", "incorrect")
WHICH = ("own", "random", "gap")


def bench_items(bench_path: str | os.PathLike, max_images: int | None = None, seed: int = 0) -> list:
    """Labelled bench rows as detector items (with caption context and decoded images, one per image); with
    ``max_images`` only the rows of that many images (a seeded sample)."""
    from halsift.corpus.images import SkipCounter
    from halsift.filtering.scoring.parts import iter_caption_groups, plan_parts

    parts, _ = plan_parts(os.fspath(bench_path))
    items = [it for p in parts for g in iter_caption_groups(p, "sentence", SkipCounter()) for it in g
             if it.meta.get("label") in LABELS]
    if max_images is not None:
        ids = sorted({it.image_id for it in items})
        keep = set(random.Random(seed).sample(ids, min(max_images, len(ids))))
        items = [it for it in items if it.image_id in keep]
    return items


def likelihood_table(det, bench_path: str | os.PathLike, seed: int = 0, max_images: int | None = None,
                     batch_size: int = 16) -> pd.DataFrame:
    """One row per labelled bench sentence: ``id``, ``image_id``, ``random_image_id``, ``generator``,
    ``position``, ``label``, ``own``, ``random``, ``gap`` (log-likelihoods in nats/token).

    ``det`` is a :class:`~halsift.filtering.detectors.vlm_judge.VlmJudge` or a detector that lends one (``vlm-judge``).
    """
    from halsift.filtering.detectors.vlm_likelihood import sentence_logliks, with_random_images

    items = bench_items(bench_path, max_images, seed)
    if not items:
        raise ValueError(f"likelihood: {bench_path} has no labelled rows with readable images")
    swapped = with_random_images(items, seed)
    own = sentence_logliks(det, items, batch_size)
    rnd = sentence_logliks(det, swapped, batch_size)
    return pd.DataFrame({"id": [it.key for it in items], "image_id": [it.image_id for it in items],
                         "random_image_id": [it.meta["random_image"] for it in swapped],
                         "generator": [it.meta.get("captioner", "") for it in items],
                         "position": [it.sentence_index for it in items],
                         "label": [it.meta["label"] for it in items], "own": own, "random": rnd,
                         "gap": np.asarray(own) - np.asarray(rnd)})


def likelihood_metrics(table: pd.DataFrame) -> dict[str, float]:
    """Flat ``likelihood/...`` metrics (module docstring) from a :func:`likelihood_table`."""
    t = table[table["label"].isin(LABELS)]
    out: dict[str, float] = {}
    for lab in (None,) + LABELS:
        sub = t if lab is None else t[t["label"] == lab]
        if lab is not None:
            out[f"likelihood/n/{lab}"] = int(len(sub))
        if sub.empty:
            continue
        pre = "" if lab is None else f"{lab}/"
        by_pos = sub.groupby("position")[list(WHICH)].mean()
        for which in WHICH:
            out.update({f"likelihood/{which}/{pre}pos{int(p)}": float(v) for p, v in by_pos[which].items()})
            out[f"likelihood/{which}/{pre}all"] = float(sub[which].mean())
    return out


def plot_likelihood(table: pd.DataFrame) -> Callable:
    """A ``draw(fig, ax)`` for the plot: mean log-likelihood by position, correct vs incorrect, own vs random."""
    t = table[table["label"].isin(LABELS)]

    def draw(fig, ax) -> None:
        for lab, color in zip(LABELS, ("tab:green", "tab:red")):
            sub = t[t["label"] == lab]
            for which, style in (("own", "-o"), ("random", "--x")):
                m = sub.groupby("position")[which].mean()
                if len(m):
                    ax.plot(m.index + 1, m.to_numpy(), style, color=color, label=f"{lab}, {which} image")
        ax.set_xlabel("sentence position")
        ax.set_ylabel("mean log-likelihood (nats/token)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)

    return draw


__all__ = ["bench_items", "likelihood_metrics", "likelihood_table", "plot_likelihood"]
