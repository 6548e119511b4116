"""Bench scoring with the clip detector encodes each distinct image once (rows of one image share one decoded image
and one batch), and the scores equal the one-row-at-a-time path."""

from __future__ import annotations

from collections import Counter

import pytest
from PIL import Image

from halsift.corpus.bench import read_bench
from halsift.corpus.images import SkipCounter
from halsift.synth.world import generate_world
from halsift.filtering.detectors.base import Item
from halsift.filtering.detectors.clip import ClipDetector
from halsift.filtering.scoring.parts import iter_caption_groups, plan_parts
from halsift.filtering.scoring.runner import score_bench


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    generate_world(out, images=40, seed=0, bench_images=6)
    return out / "bench" / "bench.jsonl"


def _counting(det: ClipDetector) -> list[int]:
    """Wrap ``encode_image``; returns the list that records the batch size of every call."""
    calls: list[int] = []
    orig = det.model.encode_image

    def wrapped(pix, *a, **kw):
        calls.append(int(pix.shape[0]))
        return orig(pix, *a, **kw)

    det.model.encode_image = wrapped
    return calls


def test_bench_rows_of_one_image_are_adjacent_and_share_the_decoded_image(bench):
    parts, _ = plan_parts(str(bench))
    items = [it for p in parts for g in iter_caption_groups(p, "sentence", SkipCounter()) for it in g]
    rows = read_bench(bench)
    assert len(items) == len(rows)
    seen, order = set(), []
    for it in items:
        if not order or order[-1] != it.image_id:
            assert it.image_id not in seen, f"rows of image {it.image_id} are not adjacent"
            order.append(it.image_id)
            seen.add(it.image_id)
    objs: dict[str, set] = {}
    for it in items:
        objs.setdefault(it.image_id, set()).add(id(it.image))
    assert all(len(v) == 1 for v in objs.values())
    assert {it.image_id for it in items} == {r.image_id for r in rows}


def test_encode_image_once_per_image_and_scores_unchanged(bench):
    rows = read_bench(bench)
    n_images = len({r.image for r in rows})
    det = ClipDetector(arch="halsift-tiny", pretrained="random", seed=0)
    calls = _counting(det)
    # batch_size larger than the bench: one batch, so exactly one encoded row per distinct image
    df = score_bench(det, bench, batch_size=10_000, show_progress=False)
    assert len(calls) == 1 and sum(calls) == n_images
    # default batch size: batches hold whole captions; an image is encoded at most once per batch it spans
    calls.clear()
    df64 = score_bench(det, bench, batch_size=64, show_progress=False)
    assert sum(calls) < len(rows) and sum(calls) <= n_images + len(calls)
    # reference: the per-row path (every row decodes its own image, no image_id: one encoded image per row)
    calls.clear()
    items = [Item(r.id, r.position, r.sentence, [], Image.open(bench.parent / r.image).convert("RGB"))
             for r in rows]
    ref = {it.key: res.score for it, res in zip(items, det.score_batch(items))}
    assert sum(calls) == len(rows)
    for frame in (df, df64):
        got = dict(zip(frame["key"], frame["score"]))
        assert set(got) == set(ref)
        assert max(abs(got[k] - ref[k]) for k in ref) < 1e-4


def test_distinct_images_with_equal_key_are_not_merged():
    det = ClipDetector(arch="halsift-tiny", pretrained="random", seed=0)
    calls = _counting(det)
    a, b = Image.new("RGB", (32, 32), (255, 0, 0)), Image.new("RGB", (32, 32), (0, 0, 255))
    items = [Item("k", 0, "a red square", [], a, "img-a"), Item("k", 1, "a red square", [], b, "img-b"),
             Item("r1", 0, "a red square", [], a, "img-a"), Item("r2", 0, "a dog", [], a, "")]
    s = [r.score for r in det.score_batch(items)]
    assert sum(calls) == 3  # img-a, img-b, and the row without image_id (grouped by its key)
    assert s[0] == pytest.approx(s[2], abs=1e-5) and s[0] != pytest.approx(s[1], abs=1e-6)
    assert Counter(calls) == Counter({3: 1})
