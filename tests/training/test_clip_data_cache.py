"""The training stream's decoded-sample cache: later epochs reuse whole shards' preprocessed images, and the batches
(images, captions, skip counts) are exactly those of the stream without it."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from messy_shards import messy_shard

import halsift.training.clip_data as clip_data
from halsift.training.clip_data import ShardStream


@pytest.fixture(autouse=True)
def _one_process(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS"):
        monkeypatch.delenv(var, raising=False)


class _Counting:
    """A deterministic preprocess (the image's pixels as floats) that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, image) -> torch.Tensor:
        self.calls += 1
        return torch.from_numpy(np.asarray(image.convert("RGB").resize((8, 8)), dtype=np.float32)).permute(2, 0, 1)


def _batches(specs, cache_bytes: int, n: int, monkeypatch, weights=None) -> tuple[list, int, int]:
    """``n`` batches of the stream (3 samples each, shuffled): what they hold, shard reads and preprocess calls."""
    reads = Counter()
    real = clip_data.read_shard

    def counting_read(url, skipped, **kw):
        reads[url] += 1
        return real(url, skipped, **kw)

    monkeypatch.setattr(clip_data, "read_shard", counting_read)
    pre = _Counting()
    stream = ShardStream(specs, pre, list, batch_size=3, weights=weights, seed=5, shuffle_buffer=4,
                         cache_bytes=cache_bytes)
    got = []
    for _, b in zip(range(n), iter(stream)):
        got.append((b["image"].clone(), b["text"], b["skipped"], b["skipped_by_kind"]))
    return got, sum(reads.values()), pre.calls


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (ia, ta, sa, ka), (ib, tb, sb, kb) in zip(a, b):
        assert torch.equal(ia, ib) and ta == tb and sa == sb and ka == kb


def test_cached_stream_yields_the_same_batches_reading_each_shard_once(tmp_path, monkeypatch):
    for i, p in enumerate("km"):
        messy_shard(tmp_path / "d" / f"{i:06d}.tar", p)
    spec = [str(tmp_path / "d")]
    plain, plain_reads, plain_calls = _batches(spec, 0, 20, monkeypatch)
    cached, cached_reads, cached_calls = _batches(spec, 1 << 20, 20, monkeypatch)
    _same(plain, cached)  # 60 samples: 7 epochs of 8 valid samples, with every epoch's skips counted again
    assert sum(s for _, _, s, _ in cached) > 2 * 11  # skips of more than one epoch were reported
    assert cached_reads == 2 and plain_reads >= 14
    assert cached_calls == 8 and plain_calls == 60  # each valid sample preprocessed once


def test_a_cache_too_small_for_every_shard_keeps_what_fits(tmp_path, monkeypatch):
    for i, p in enumerate("km"):
        messy_shard(tmp_path / "d" / f"{i:06d}.tar", p)
    spec = [str(tmp_path / "d")]
    plain, _, _ = _batches(spec, 0, 20, monkeypatch)
    one_shard = 4 * 3 * 8 * 8 * 4  # 4 valid samples of 3x8x8 float32
    partial, reads, _ = _batches(spec, one_shard, 20, monkeypatch)
    _same(plain, partial)
    assert 2 < reads < 14  # one shard kept, the other read every epoch


def test_mixture_of_specs_is_unchanged_by_the_cache(tmp_path, monkeypatch):
    messy_shard(tmp_path / "a" / "000000.tar", "k")
    messy_shard(tmp_path / "b" / "000000.tar", "m")
    specs = [str(tmp_path / "a"), str(tmp_path / "b")]
    plain, _, _ = _batches(specs, 0, 15, monkeypatch, weights=[1.0, 3.0])
    cached, reads, _ = _batches(specs, 1 << 20, 15, monkeypatch, weights=[1.0, 3.0])
    _same(plain, cached)
    assert reads == 2


def test_train_clip_caches_only_where_data_is_read_again(monkeypatch, tmp_path):
    """The trainer passes its budget for the eval transform over several epochs, and 0 for augment's random crops or
    a run that reads its data at most once (24 samples here)."""
    from filtering_data import make_corpus

    from halsift.training.clip_config import ClipTrainConfig
    from halsift.training.clip_train import ContrastiveTask

    data = make_corpus(tmp_path / "d", shards=2, per_shard=12)
    seen = []

    def fake_loader(*a, **kw):
        seen.append(kw["cache_bytes"])
        return iter(())

    monkeypatch.setattr(clip_data, "make_loader", fake_loader)
    for augment, steps in ((False, 4), (True, 4), (False, 3)):  # 4 x 8 samples: read again; 3 x 8: once
        task = ContrastiveTask(ClipTrainConfig(data=[str(data)], out=str(tmp_path / "o"), model="halsift-tiny",
                                               augment=augment, cache_mb=3, steps=steps, batch_size=8))
        task.setup(type("A", (), {"process_index": 0, "num_processes": 1})())  # counts the samples once, here
        task.preprocess_train = task.preprocess_eval = task.tokenizer = None
        list(task.batches(0))
    assert seen == [3 << 20, 0, 0]
