"""A corpus copy without some keys (the dedup recipe stage's decontaminated corpus), one output shard per input shard,
each a part of a job of the execution layer: a shard is copied again only when its input's content or the keys
dropped from it changed, so a new dedup result that drops the same samples rewrites nothing (and the score parts
made from the copy stay valid)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from halsift.corpus.fingerprint import file_fingerprint
from halsift.corpus.safe_paths import remove_file
from halsift.corpus.shards import ShardWriter, iter_shard, write_json_atomic


def write_without(shards: Iterable[Path], drop: set[str], out: str | os.PathLike,
                  keys_of: Callable[[Path], set[str]] | None = None, show_progress: bool = False) -> int:
    """Copy every sample of ``shards`` but those keyed in ``drop`` into ``out``, one output shard per input shard
    (``NNNNNN.tar`` by the input's position), samples as stored (a sample the reader would skip is copied and skipped
    downstream); returns the samples written. ``keys_of(shard)``: the keys a shard holds (e.g. from dedup's per-shard
    parts), so that a shard's record names only the dropped keys it holds; without it every shard's record names the
    whole ``drop`` set. Shards of ``out`` that no input shard makes any more are removed."""
    from halsift.execution.engines import run_job
    from halsift.execution.stage_job import StageJob, StagePart

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, shard in enumerate(shards):
        mine = sorted(drop & keys_of(shard)) if keys_of is not None else sorted(drop)
        made_from = {"source_fp": file_fingerprint(shard),
                     "drop": hashlib.blake2b(json.dumps(mine).encode(), digest_size=16).hexdigest()}
        parts.append(StagePart(f"{i:06d}.tar", (i, str(shard), tuple(mine), str(out), made_from)))
    run_job(StageJob("dedup", out, parts, _copy, _copied, show_progress=show_progress))
    names = {p.name for p in parts}
    for f in [*out.glob("*.tar"), *out.glob("*_stats.json")]:
        if f.name not in names and f.name.removesuffix("_stats.json") + ".tar" not in names:
            remove_file(f)
    sizes = {n: json.loads((out / f"{n[:-4]}_stats.json").read_text())["count"] for n in sorted(names)
             if (out / n).is_file()}
    write_json_atomic(out / "sizes.json", sizes)
    return sum(sizes.values())


def _copy(part) -> None:
    from halsift.execution.run_folder import forget_part, part_done

    i, shard, drop, out, made_from = part.args
    out, drop = Path(out), set(drop)
    forget_part(out, part.name)
    (out / part.name).unlink(missing_ok=True)
    with ShardWriter(out, maxcount=10**9, start_index=i) as w:
        for s in iter_shard(Path(shard)):
            if s.key not in drop:
                w.write(s)
    # a shard whose every sample is dropped has no output: recorded empty, done like the others
    part_done(out, part.name, made_from, empty=not (out / part.name).is_file())


def _copied(part) -> bool:
    from halsift.execution.run_folder import part_reusable

    *_, out, made_from = part.args
    return part_reusable(out, part.name, made_from)
