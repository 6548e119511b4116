"""Subset files of a selection: DataComp's uid ``.npy`` (for its ``resharder.py --subset-file`` and
``baselines.py``) or a plain key list.

DataComp names a pool sample by ``uid``, 32 hex digits (128 bits) in the sample's json; a subset file is a
sorted, unique NumPy array of dtype ``u8,u8`` (the uid's high and low 64 bits), saved with ``np.save``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from halsift.corpus.atomic import atomic_file

UID_DTYPE = np.dtype("u8,u8")
_UID_RE = re.compile(r"^[0-9a-fA-F]{32}$")


def uid_array(uids: Iterable[str]) -> np.ndarray:
    """Sorted unique ``u8,u8`` pairs of 32-hex-digit uids; raises ``ValueError`` naming the first bad one."""
    pairs = set()
    for u in uids:
        if not _UID_RE.match(u):
            raise ValueError(f"uid {u!r}: expected 32 hex digits (a DataComp uid)")
        pairs.add((int(u[:16], 16), int(u[16:], 16)))
    arr = np.array(sorted(pairs), dtype=UID_DTYPE)
    return arr


def sample_uid(meta: dict, key: str) -> str | None:
    """A sample's DataComp uid: its json ``uid``, else its key when that is 32 hex digits, else None."""
    uid = meta.get("uid")
    if uid is None and _UID_RE.match(key):
        uid = key
    return None if uid is None else str(uid)


def check_uids_up_front(data: str | os.PathLike) -> None:
    """Raise ``ValueError`` naming the shard and sample when the first sample of a shard of ``data`` has no uid:
    a ``.npy`` subset file needs one per kept sample, and a selection must not be written only to fail after
    (img2dataset output without a ``uid`` field). One sample a shard: a cheap check before any work."""
    from halsift.corpus.images import SkipCounter
    from halsift.corpus.shards import ShardFormatError, expand_shards, iter_shard

    for shard in expand_shards(data):
        try:
            first = next(iter(iter_shard(shard, SkipCounter())), None)
        except ShardFormatError:
            continue  # a damaged shard: the selection counts it
        if first is not None and sample_uid(first.meta, str(first.meta.get("parent_key", first.key))) is None:
            raise ValueError(f"{shard}: sample {first.key}: json field 'uid' is missing (a DataComp uid, needed for "
                             "the .npy subset file); export a key list (.txt) instead")


def selection_ids(select_dir: str | os.PathLike, uids: bool) -> list[str]:
    """The source samples a selection kept: their json ``uid`` (``uids=True``; a sample without one whose key is
    itself 32 hex digits uses the key) or their source keys (``parent_key`` for sentence units)."""
    from halsift.corpus.shards import iter_samples

    out = []
    for s in iter_samples(select_dir):
        key = str(s.meta.get("parent_key", s.key))
        if not uids:
            out.append(key)
            continue
        uid = sample_uid(s.meta, key)
        if uid is None:
            raise ValueError(f"sample {key}: json field 'uid' is missing (a DataComp uid); export a key list "
                             "(.txt) instead")
        out.append(str(uid))
    return out


def write_subset(path: str | os.PathLike, select_dir: str | os.PathLike) -> int:
    """Write the subset file of a selection folder: ``.npy`` = DataComp uids, anything else = one source key
    per line (sorted, unique). Returns the number of entries."""
    path = Path(path)
    as_npy = path.suffix == ".npy"
    ids = selection_ids(select_dir, uids=as_npy)
    with atomic_file(path) as tmp:
        if as_npy:
            arr = uid_array(ids)
            with open(tmp, "wb") as f:
                np.save(f, arr)
            n = len(arr)
        else:
            keys = sorted(set(ids))
            tmp.write_text("".join(k + "\n" for k in keys), encoding="utf-8")
            n = len(keys)
    return n
