"""One reader (issue 30): training, scoring and the evals keep and skip the same samples of a messy shard, for the
same reasons, and turn bench rows into the same items."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from messy_shards import BROKEN_JPG, messy_shard

from halsift.corpus.images import ImageDecodeError, SkipCounter, decode_image
from halsift.filtering.scoring.parts import iter_caption_groups, plan_parts

KEY = re.compile(r"\b[km]\d\d\b")


def _key(caption: str) -> str:
    """The key a caption names (the caption itself where it names none)."""
    m = KEY.search(caption)
    return m.group() if m else caption


def _expected(p: str = "k") -> tuple[list[str], dict[str, int]]:
    with pytest.raises(ImageDecodeError, match=".") as e:  # any reason: its kind is what is counted
        decode_image(BROKEN_JPG)
    kinds = Counter({"duplicate": 1, "bad_caption": 1, "corrupt": 2, "missing_image": 1, "empty_caption": 3,
                     "corrupt_shard": 1})
    kinds[e.value.kind] += 1
    return sorted(f"{p}{i}" for i in ("00", "02", "09", "11")), dict(kinds)


def _score_read(spec, unit: str = "sentence") -> tuple[list[str], dict[str, int]]:
    """What ``halsift score`` reads: the keys of its caption groups and its skip counts."""
    parts, _ = plan_parts(spec)
    skipped = SkipCounter()
    keys = [g[0].key for part in parts for g in iter_caption_groups(part, unit, skipped)]
    return sorted(keys), dict(skipped.counts)


def _zeros(image) -> torch.Tensor:
    return torch.zeros(1)


def _texts(captions: list[str]) -> list[str]:
    return list(captions)


def _train_epoch(folder: Path, max_batches: int = 100) -> tuple[list[str], dict[str, int], int]:
    """One epoch of ``train clip``'s loader (batch 1, no shuffle): its keys, skips by kind and skipped total. The
    epoch ends where the first caption comes round again (the first sample is valid, so that batch's skips are the
    end of the epoch's)."""
    from halsift.training.clip_data import make_loader

    loader = make_loader([str(folder)], _zeros, _texts, batch_size=1, seed=0, workers=0, shuffle_buffer=0)
    captions, kinds, total, first = [], Counter(), 0, None
    for i, batch in enumerate(loader):
        (caption,) = batch["text"]
        total += int(batch["skipped"])
        kinds.update(batch.get("skipped_by_kind", {}))
        if caption == first or i == max_batches:
            break
        first = first or caption
        captions.append(caption)
    return sorted(map(_key, captions)), dict(kinds), total


@pytest.fixture(autouse=True)
def _one_process(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "WORKER", "NUM_WORKERS"):
        monkeypatch.delenv(var, raising=False)


def test_training_and_scoring_keep_and_skip_the_same_samples(tmp_path):
    messy_shard(tmp_path / "d" / "000000.tar")
    want_keys, want_kinds = _expected()
    train_keys, train_kinds, train_total = _train_epoch(tmp_path / "d")
    score_keys, score_kinds = _score_read(tmp_path / "d")
    assert train_keys == score_keys == want_keys
    assert train_kinds == score_kinds == want_kinds
    assert train_total == sum(want_kinds.values())


def test_validity_does_not_depend_on_the_scoring_unit(tmp_path):
    messy_shard(tmp_path / "d" / "000000.tar")
    assert _score_read(tmp_path / "d", "caption") == _score_read(tmp_path / "d", "sentence") == _expected()


def test_dataloader_workers_split_shards_and_keep_the_valid_samples(tmp_path):
    """Two workers, one messy shard each: together they yield every valid key of both and nothing else."""
    from halsift.training.clip_data import make_loader

    for i, p in enumerate("km"):
        messy_shard(tmp_path / "d" / f"{i:06d}.tar", p)
    loader = make_loader([str(tmp_path / "d")], _zeros, _texts, batch_size=1, seed=0, workers=2, shuffle_buffer=0)
    seen, kinds = [], Counter()
    for _, batch in zip(range(40), loader):  # 20 per worker: 4 epochs of a 5-sample shard
        seen.append(_key(batch["text"][0]))
        kinds.update(batch.get("skipped_by_kind", {}))
    score_keys, score_kinds = _score_read(tmp_path / "d")
    assert sorted(set(seen)) == score_keys == sorted(_expected("k")[0] + _expected("m")[0])
    assert set(kinds) == set(score_kinds)


def test_read_samples_counts_by_kind_with_keys(tmp_path):
    from halsift.corpus.sample import read_samples

    messy_shard(tmp_path / "000000.tar")
    skipped = SkipCounter()
    got = list(read_samples(tmp_path, skipped))
    assert sorted(s.key for s in got) == _expected()[0]
    by_key = {e["key"]: e["kind"] for e in skipped.examples}
    assert by_key["k07"] == "empty_caption" and by_key["k05"] == "corrupt" and by_key["000000.tar"] == "corrupt_shard"
    rgba = next(s for s in got if s.key == "k02")
    assert rgba.image.mode == "RGB" and rgba.image.getpixel((0, 0))[1] > 100  # alpha composited over white
    first = next(s for s in got if s.key == "k00")
    assert first.caption == "A red square k00 on grey."  # the first of a repeated key is the one kept


def test_read_shard_without_decoding_applies_every_other_rule(tmp_path):
    from halsift.corpus.sample import read_shard

    messy_shard(tmp_path / "000000.tar")
    skipped = SkipCounter()
    keys = sorted(s.key for s in read_shard(tmp_path / "000000.tar", skipped, decode=False))
    assert keys == sorted(_expected()[0] + ["k01"])  # only the undecodable image is let through
    assert all(s.image is None for s in read_shard(tmp_path / "000000.tar", SkipCounter(), decode=False))


def test_bench_rows_become_the_same_items_for_training_and_scoring(tmp_path):
    """``train detector`` and ``score``/``eval bench`` build one caption's items alike, rows in any file order."""
    from filtering_data import make_bench

    from halsift.corpus.bench import read_bench
    from halsift.training.detector_train import row_items

    bench = make_bench(tmp_path / "b", captions=6, seed=3)
    lines = bench.read_text().splitlines()
    random.Random(0).shuffle(lines)  # a caption's rows out of position order
    bench.write_text("\n".join(lines) + "\n")
    parts, _ = plan_parts(bench)
    scored = [it for part in parts for g in iter_caption_groups(part, "sentence", SkipCounter()) for it in g]
    rows = [json.loads(x) for x in lines]
    trained = row_items(bench, read_bench(bench))
    assert len(rows) == len(scored) == len(trained) and any(it.context for it in scored)

    def view(it):
        meta = {k: v for k, v in it.meta.items() if k != "image_path"}
        return it.key, it.sentence_index, it.sentence, it.context, it.image_id, meta

    assert sorted(map(view, trained)) == sorted(map(view, scored))
    assert all(Path(it.meta["image_path"]).is_file() for it in trained)
