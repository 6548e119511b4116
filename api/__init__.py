"""halsift: curate image-caption data with hallucination detectors.

The notebook API (the CLI, ``halsift --help``, does the same on shards and benchmark files)::

    import halsift
    df = halsift.score_pairs(["cat.jpg", pil_image], ["A cat on a mat. It is blue.", "A red bus."],
                             detector="clip:arch=ViT-B-32,pretrained=openai")
    kept = halsift.select(df, keep=0.5)          # the best-scored half of the sentences

Everything heavy (torch, open_clip, transformers) is imported on first use, so ``import halsift`` is instant.
The stage packages are ``halsift.corpus``, ``halsift.filtering``, ``halsift.training``, ``halsift.eval`` and
``halsift.launch`` (DESIGN.md).
"""

import os as _os
import typing as _typing

if _typing.TYPE_CHECKING:  # annotations only (quoted below): nothing but __all__ is public
    from collections.abc import Sequence
    from os import PathLike
    from typing import Any

__all__ = ["load_detector", "score", "score_pairs", "select"]  # the whole public namespace (a test keeps it so)


def score(detector: "Any", data: "str | PathLike", out: "str | PathLike", engine: str = "local",
          **settings: "Any") -> dict:
    """Score shards (or a ``bench.jsonl``) into the folder ``out`` as ``halsift score`` does: one
    :class:`~halsift.filtering.scoring.job.ScoreJob` (``settings``: its fields, e.g. ``batch_size``, ``unit``,
    ``decode_workers``) run by ``engine``; resumes a folder of the same job. Returns the folder's manifest."""
    import json
    from pathlib import Path

    from halsift.execution.engines import run_job
    from halsift.filtering.scoring.job import ScoreJob

    run_job(ScoreJob(detector=detector, data=data, out=out, **settings), engine)
    return json.loads((Path(out) / "_manifest.json").read_text())


def load_detector(spec: "Any", device: "str | None" = None):
    """A detector from a spec string (``clip:arch=ViT-B-32,pretrained=openai``, ``random:seed=0``, ``vlm:...``),
    a YAML file or a dict; moved to ``device`` when given."""
    from halsift.filtering.detectors.spec import load_detector as _load

    det = _load(spec)
    return det.to(device) if device else det


def _image(x: "Any", i: int):
    """A PIL image (RGB) from a PIL image, a path or bytes; raises naming the position of a bad one."""
    from PIL import Image

    from halsift.corpus.images import decode_image

    if isinstance(x, Image.Image):
        return x.convert("RGB")
    if isinstance(x, (str, _os.PathLike)):
        try:
            with open(x, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ValueError(f"images[{i}]: cannot read {_os.fspath(x)!r} ({e.strerror or e})") from None
        return decode_image(data, f"images[{i}]")
    if isinstance(x, (bytes, bytearray)):
        return decode_image(bytes(x), f"images[{i}]")
    raise TypeError(f"images[{i}]: expected a PIL image, a path or bytes, got {type(x).__name__}")


def score_pairs(images: "Sequence[Any]", captions: "Sequence[str]",
                detector: "Any" = "clip:arch=ViT-B-32,pretrained=openai", *, unit: str = "sentence",
                batch_size: int = 64, device: str | None = None):
    """Score image-caption pairs; returns a pandas DataFrame with one row per sentence (``unit="sentence"``) or
    per caption (``unit="caption"``): ``pair`` (position in the inputs), ``sentence_index`` (-1 for a whole
    caption), ``sentence``, ``score`` (0-100, higher = more likely correct), ``parsed``, ``detector``.

    ``images``: PIL images, paths or bytes; ``captions``: one string per image. ``detector``: a spec (see
    :func:`load_detector`) or a detector object. Sentences are split as ``halsift score`` splits them.
    """
    import pandas as pd

    from halsift.corpus.sample import Item, caption_items
    from halsift.corpus.sentences import sentence_texts

    if len(images) != len(captions):
        raise ValueError(f"images and captions differ in length ({len(images)} vs {len(captions)})")
    from halsift.corpus.units import check_unit

    check_unit(unit)
    det = load_detector(detector, device)
    items: list[Item] = []
    for i, (img, cap) in enumerate(zip(images, captions)):
        pil = _image(img, i) if det.needs_image else None
        items += caption_items(str(i), str(cap), sentence_texts(str(cap)), pil, str(i), unit=unit)
    from halsift.filtering.scoring.guard import ScoreGuard

    guard = ScoreGuard(det.name, max_parse_failures=1.0)  # a non-finite score is an error, never a row
    rows = []
    for start in range(0, len(items), batch_size):
        batch = items[start:start + batch_size]
        results = det.score_batch(batch)
        guard.check([(it.key, it.sentence_index, "") for it in batch], [float(r.score) for r in results],
                    [bool(r.parsed) for r in results])
        for it, r in zip(batch, results):
            rows.append({"pair": int(it.key), "sentence_index": it.sentence_index, "sentence": it.sentence,
                         "score": float(r.score), "parsed": bool(r.parsed), "detector": det.name})
    return pd.DataFrame(rows, columns=["pair", "sentence_index", "sentence", "score", "parsed", "detector"])


def select(scores, *, keep: float | None = None, top_k: int | None = None, threshold: float | None = None,
           unit: str = "sentence", agg: str = "min"):
    """The kept rows of a :func:`score_pairs` frame, best first: the top ``keep`` fraction, ``top_k`` rows or those
    scoring at least ``threshold`` -- sentences, or with ``unit="caption"`` whole captions by ``agg`` (min /
    mean / prob) of their sentence scores (one row per pair, ``score`` the aggregate). Ties are broken as
    ``halsift select`` breaks them."""
    import pyarrow as pa

    from halsift.filtering.selection.select import select_keys

    t = pa.table({"key": scores["pair"].astype(str).tolist(), "sentence_index": scores["sentence_index"].tolist(),
                  "score": scores["score"].astype(float).tolist()})
    kept, _ = select_keys(t, keep=keep, top_k=top_k, threshold=threshold, unit=unit,
                          agg=agg if unit == "caption" else "min")
    k = kept.to_pandas()
    k["pair"] = k["key"].astype(int)
    if unit == "sentence":
        out = scores.merge(k[["pair", "sentence_index"]], on=["pair", "sentence_index"])
    else:
        out = k[["pair", "score"]]
    return out.sort_values("score", ascending=False, kind="stable").reset_index(drop=True)
