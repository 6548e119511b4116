"""A corpus copy without some keys (the dedup recipe stage's decontaminated corpus)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from halsift.corpus.safe_paths import remove_tree
from halsift.corpus.shards import ShardWriter, iter_shard


def write_without(shards: Iterable[Path], drop: set[str], out: str | os.PathLike) -> int:
    """Copy every sample of ``shards`` but those keyed in ``drop`` into ``out`` (cleared first), one output shard
    per input shard, samples as stored (a sample the reader would skip is copied and skipped downstream); returns
    the samples written."""
    out = Path(out)
    if out.exists():
        remove_tree(out)
    total = 0
    for i, shard in enumerate(shards):
        with ShardWriter(out, maxcount=10**9, start_index=i) as w:
            for s in iter_shard(shard):
                if s.key not in drop:
                    w.write(s)
                    total += 1
    return total
