"""Stored embeddings for CLIP-family detectors (``clip:...,embeddings=DIR``): each scored item's image and text
vectors read from a folder ``halsift embed`` wrote (:mod:`halsift.corpus.embedding_store`), instead of encoded.

The folder is checked when the detector is built: complete, embedded by the same model (the detector's
``encoder_id``: arch, weights, seed, ``fast_decode``) and of the model's width; else one line naming the folder.
Vectors are found by key: an index key -> part (the parts' ``key`` columns, read once), then the part's vectors
(the last few parts kept: batches come part by part). An item whose vectors are not stored is a
:class:`~halsift.filtering.detectors.base.DetectorError` naming the key (embedded from other shards?).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from halsift.corpus.embedding_store import (CAPTION, IMAGE, EmbeddingStoreError, part_paths, read_manifest,
                                            _read_part)
from halsift.corpus.sample import CAPTION_INDEX, Item
from halsift.filtering.detectors.base import DetectorError

CACHED_PARTS = 4


class EmbeddingLookup:
    """The vectors of one embeddings folder, by (key, sentence_index)."""

    def __init__(self, folder: str | os.PathLike, encoder_id: str, dim: int) -> None:
        self.folder = Path(folder)
        m = read_manifest(folder)
        if not m.get("complete"):
            raise EmbeddingStoreError(f"embeddings={folder}: not complete (rerun `halsift embed` to finish it)")
        if m["model"] != encoder_id:
            raise EmbeddingStoreError(f"embeddings={folder}: embedded by {m['model']!r}, this detector's model is "
                                      f"{encoder_id!r}; embed with this model or drop embeddings=")
        if int(m["dim"]) != dim:
            raise EmbeddingStoreError(f"embeddings={folder}: {m['dim']}-dimensional vectors, the model's are "
                                      f"{dim}-dimensional; re-embed with this model")
        self.dim = dim
        self._parts = part_paths(folder)
        self._where: dict[str, int] | None = None
        self._cache: OrderedDict[int, dict[tuple[str, int], np.ndarray]] = OrderedDict()

    def _part_of(self, key: str) -> int:
        if self._where is None:
            import pyarrow.parquet as pq

            self._where = {}
            for i, p in enumerate(self._parts):
                for k in pq.read_table(p, columns=["key"]).column("key").to_pylist():
                    self._where.setdefault(k, i)
        try:
            return self._where[key]
        except KeyError:
            raise DetectorError(f"embeddings={self.folder}: no vectors for sample {key!r} (embed the shards you "
                                "score)") from None

    def _part(self, i: int) -> dict[tuple[str, int], np.ndarray]:
        if i in self._cache:
            self._cache.move_to_end(i)
            return self._cache[i]
        keys, idx, vectors = _read_part(self._parts[i], self.dim, None)
        rows = {(k, int(j)): v for k, j, v in zip(keys, idx, vectors)}
        self._cache[i] = rows
        while len(self._cache) > CACHED_PARTS:
            self._cache.popitem(last=False)
        return rows

    def _get(self, key: str, index: int) -> np.ndarray:
        try:
            return self._part(self._part_of(key))[(key, index)]
        except KeyError:
            what = {IMAGE: "image", CAPTION: "caption"}.get(index, f"sentence {index}")
            raise DetectorError(f"embeddings={self.folder}: no {what} vector for sample {key!r} (embedded from "
                                "other sentences? re-embed these shards)") from None

    def vectors(self, items: Sequence[Item]) -> dict:
        """``{"image_vectors": float16 [n, D], "text_vectors": float16 [n, D]}``: each item's image vector and its
        sentence's (or, for a whole caption, the caption's) vector."""
        img = np.stack([self._get(it.key, IMAGE) for it in items]) if items else np.empty((0, self.dim), np.float16)
        txt = (np.stack([self._get(it.key, CAPTION if it.sentence_index == CAPTION_INDEX else it.sentence_index)
                         for it in items]) if items else np.empty((0, self.dim), np.float16))
        return {"image_vectors": img, "text_vectors": txt}


__all__ = ["EmbeddingLookup"]
