"""Hallucinated-segment localization (AlignBench Table 5 / Table H, HalDec-Bench Table 5 / Table K).

A localizing judge marks the wrong part of the sentence as ``**[...]**`` (e.g. ``A **[red]** bird singing in a
tree.``), often inside a ```` ```json {"output": "..."} ``` ```` block. :func:`parse_marked` turns that into
``[start_word, end_word)`` ranges over whitespace words — the bench's ``spans`` convention, the same words as
``str.split()`` (and ``halsift.corpus.sentences.words``).

Metrics, over the sentences that have ground-truth spans:
- AP: the share (%) of predicted spans whose IoU with some ground-truth span is >= 0.3 (appendix E, "a prediction
  is considered correct if its IoU with a GT span is greater than or equal to 0.3 ... precision as the proportion
  of predicted spans that are judged correct").
- mIoU: per sentence, the IoU between the predicted and the ground-truth word sets (the union of each side's
  spans; no prediction = 0), averaged over all sentences (Table K, "compute the intersection over union between
  the predicted and ground-truth segments and compute the average for all samples").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from halsift.corpus.percent import percent, ratio_percent
from halsift.filtering.detectors.marked_spans import Span, parse_marked, unwrap_output  # noqa: F401 (re-exported)

IOU_THRESHOLD = 0.3

def span_iou(a: Sequence[int], b: Sequence[int]) -> float:
    """IoU of two word ranges ``[start, end)``."""
    inter = max(0, min(a[1], b[1]) - max(a[0], b[0]))
    union = (a[1] - a[0]) + (b[1] - b[0]) - inter
    return inter / union if union > 0 else 0.0


def set_iou(pred: Sequence[Sequence[int]], gt: Sequence[Sequence[int]]) -> float:
    """IoU of the word sets covered by two lists of ranges (0 if either side is empty)."""
    p = {i for s, e in pred for i in range(s, e)}
    g = {i for s, e in gt for i in range(s, e)}
    if not p or not g:
        return 0.0
    return len(p & g) / len(p | g)


def localization_metrics(preds: Sequence[Sequence[Sequence[int]]], gts: Sequence[Sequence[Sequence[int]]],
                         threshold: float = IOU_THRESHOLD) -> dict[str, float]:
    """AP and mIoU (both %) over sentences; ``preds[i]`` / ``gts[i]`` are the spans of sentence i.

    Sentences without a ground-truth span are skipped. Returns ``ap`` (NaN when nothing was predicted), ``miou``,
    ``n_sentences``, ``n_pred``, ``n_hit``.
    """
    if len(preds) != len(gts):
        raise ValueError(f"localization: {len(preds)} predictions but {len(gts)} ground truths")
    n_pred = n_hit = n = 0
    ious = []
    for p, g in zip(preds, gts):
        if not len(g):
            continue
        n += 1
        for span in p:
            n_pred += 1
            n_hit += max(span_iou(span, gs) for gs in g) >= threshold - 1e-12  # 0.3 inclusive despite float error
        ious.append(set_iou(p, g))
    return {"ap": ratio_percent(n_hit, n_pred), "miou": percent(np.mean(ious)) if ious else float("nan"),
            "n_sentences": n, "n_pred": n_pred, "n_hit": n_hit}
