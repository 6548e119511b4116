"""The dedup stage: decontaminate the corpus before scoring (``dedup`` recipe section; docs/curation.md).

``halsift dedup`` of the corpus against the recipe's own retrieval sets and bench (plus ``dedup.against``) into
``<run>/dedup``, then a copy of the corpus without the listed samples (leaks and all but one of each duplicate
group) in ``<run>/dedup/corpus``, one shard per input shard: the corpus the score, select and finetune stages read
(:func:`~halsift.launch.stages.base.resolve_paths`). ``dedup.enabled: false`` keeps the corpus as it is (Table F
with and without decontamination).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from halsift.launch.stages.base import Paths, Stage

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def against_sets(r: Recipe, p: Paths) -> list[str]:
    """The evaluation image sets the corpus is checked against: each retrieval set, the bench, ``dedup.against``."""
    return [*p.retrieval.values(), *([p.bench] if p.bench else []), *r.dedup.against]


def _keys(out, shard) -> set[str]:
    """The keys of ``shard``, from dedup's own part of it (a key column: no shard read)."""
    import pyarrow.parquet as pq

    from halsift.filtering.curation.hash_parts import part_path

    return set(pq.read_table(part_path(out / "_parts", shard), columns=["key"])["key"].to_pylist())


def stage_dedup(r: Recipe, p: Paths) -> dict:
    from functools import partial

    from halsift.corpus.shards import expand_shards
    from halsift.filtering.curation import excluded_keys
    from halsift.filtering.curation.dedup import run_dedup
    from halsift.filtering.curation.rewrite import write_without

    out = p.stage("dedup")
    source = p.source_corpus
    flags = {f: getattr(r.dedup, f) for f in ("decode_workers", "address", "workers")}  # a recipe runs it whole
    m = run_dedup(source, out, against=against_sets(r, p), model=r.dedup.model or None, exact_on=r.dedup.exact_on,
                  phash_distance=r.dedup.phash_distance, near_thumbnail=r.dedup.near_thumbnail,
                  eval_thumbnail=r.dedup.eval_thumbnail, cosine=r.dedup.cosine, nprobe=r.dedup.nprobe,
                  show_progress=True, allow_implausible=r.dedup.allow_implausible, engine=r.dedup.engine, **flags)
    kept = write_without(expand_shards(source), excluded_keys(out), out / "corpus", keys_of=partial(_keys, out))
    print(f"[halsift run] dedup: removed {m['removed']} of {m['samples']} corpus samples (leaks {m['counts']['eval']}, "
          f"exact {m['counts']['exact']}, near {m['counts']['near']}); {kept} kept in {out / 'corpus'}")
    return {"dedup": {k: m[k] for k in ("samples", "counts", "removed", "groups", "thresholds")}, "kept": kept}


STAGE = Stage("dedup", ("dedup",), stage_dedup, enabled=lambda r: r.dedup.enabled)
