"""The select manifest's precision fields on the one scale (0–100), whatever halsift wrote the manifest.

A manifest records ``"scale": 100`` since its precision fields are percentages; one without it (written by an
earlier halsift) holds shares (0–1). Every reader that shows or logs a manifest's precision (the select summary
line and page, wandb, the compare report) reads it through :func:`on_percent_scale`."""

from __future__ import annotations

from collections.abc import Mapping

from halsift.corpus.percent import SCALE, percent

PRECISION_MAPS = ("precision", "sentence_precision")  # {input, kept, input/<captioner>, kept/<captioner>}
PRECISION_SCALARS = ("kept_precision", "input_precision")  # single numbers of older manifest formats


def on_percent_scale(manifest: Mapping) -> dict:
    """``manifest`` with its precision fields as percentages (0–100) and ``scale`` set: as it is when it records
    ``scale: 100``; without ``scale`` (an older manifest: shares) each precision number times 100. Raises
    ``ValueError`` for another ``scale``."""
    scale = manifest.get("scale", 1)
    if scale == SCALE:
        return dict(manifest)
    if scale != 1:
        raise ValueError(f"select manifest: scale {scale!r}: expected {SCALE} (percentages) or none (shares, 0–1)")
    out = dict(manifest, scale=SCALE)
    for key in PRECISION_MAPS:
        if isinstance(manifest.get(key), Mapping):
            out[key] = {k: _share_to_percent(v) for k, v in manifest[key].items()}
    for key in PRECISION_SCALARS:
        if key in manifest:
            out[key] = _share_to_percent(manifest[key])
    return out


def _share_to_percent(v):
    return percent(v, 4) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
