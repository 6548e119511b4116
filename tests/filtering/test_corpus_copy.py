"""The decontaminated corpus copy (``filtering/curation/rewrite.write_without``, the dedup recipe stage's output): a
shard whose every sample is dropped is a finished part with no output shard, not a part "not written" that fails
the stage on every run."""

from __future__ import annotations

from pathlib import Path

from filtering_data import make_corpus

from halsift.corpus.shards import expand_shards, iter_shard
from halsift.filtering.curation.rewrite import write_without


def test_a_shard_whose_every_sample_is_dropped_is_done_and_stays_done(tmp_path):
    shards = [Path(s) for s in expand_shards(str(make_corpus(tmp_path / "c", shards=2, per_shard=3, seed=1)))]
    drop = {s.key for s in iter_shard(shards[0])}
    out = tmp_path / "out"

    def keys_of(shard: Path) -> set[str]:  # each shard's record names only the dropped keys it holds
        return {s.key for s in iter_shard(shard)}

    assert write_without(shards, drop, out, keys_of) == 3
    assert not (out / "000000.tar").exists() and (out / "000001.tar").is_file()
    kept = (out / "000001.tar").stat().st_mtime_ns
    assert write_without(shards, drop, out, keys_of) == 3  # again: nothing copied, nothing failed
    assert (out / "000001.tar").stat().st_mtime_ns == kept
    assert write_without(shards, drop - {sorted(drop)[0]}, out, keys_of) == 4  # a key no longer dropped: that shard copied
    assert (out / "000000.tar").is_file() and (out / "000001.tar").stat().st_mtime_ns == kept
