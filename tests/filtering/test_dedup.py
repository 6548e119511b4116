"""halsift dedup: exact copies, re-encoded copies (phash), planted leaks, bad inputs, --embeddings == --model."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from halsift.corpus.shards import Sample, ShardWriter
from halsift.filtering.curation import excluded_keys
from halsift.launch.cli import main

M = {"captioner": "t", "source": "i2t"}


def _png(seed: int, size: int = 64) -> bytes:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)  # smooth blocks: a photo-like low-frequency image
    img = Image.fromarray(small).resize((size, size), Image.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(data: bytes, quality: int = 80, size: int = 80) -> bytes:
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((size, size), Image.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _corpus(tmp_path):
    """20 distinct images; c20, c21 byte-identical copies of c03 and c07; c22 a re-encoded, resized c11; a sample
    with an undecodable image and one with an empty caption."""
    samples = [Sample(f"c{i:02d}", _png(i), f"Caption number {i}.", dict(M), ext="png") for i in range(20)]
    samples += [Sample("c20", _png(3), "Another caption.", dict(M), ext="png"),
                Sample("c21", _png(7), "Caption number 7.", dict(M), ext="png"),
                Sample("c22", _jpeg(_png(11)), "A third caption.", dict(M), ext="jpg"),
                Sample("bad", b"not an image", "Broken.", dict(M), ext="png"),
                Sample("empty", _png(99), "  ", dict(M), ext="png")]
    with ShardWriter(tmp_path / "corpus", maxcount=10) as w:
        for s in samples:
            w.write(s)
    return tmp_path / "corpus"


def test_exact_and_reencoded_copies_and_bad_samples(tmp_path, capsys):
    data = _corpus(tmp_path)
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "d"), "--no-progress"]) == 0
    rows = {r["key"]: r for r in pq.read_table(tmp_path / "d" / "duplicates.parquet").to_pylist()}
    assert set(rows) == {"c20", "c21", "c22"}
    assert (rows["c20"]["reason"], rows["c20"]["group"], rows["c20"]["matched"]) == ("exact", "c03", "c03")
    assert (rows["c21"]["reason"], rows["c21"]["matched"], rows["c21"]["similarity"]) == ("exact", "c07", 1.0)
    assert (rows["c22"]["reason"], rows["c22"]["matched"]) == ("near", "c11")
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m["counts"] == {"exact": 2, "near": 1, "eval": 0} and m["samples"] == 23
    assert m["skipped"]["by_kind"] == {"not_image": 1, "empty_caption": 1}
    assert excluded_keys(tmp_path / "d") == {"c20", "c21", "c22"}
    # rerun: every shard part is reused, same result
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "d"), "--no-progress"]) == 0
    m2 = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m2["shards_reused"] == 3 and m2["counts"] == m["counts"]
    # a shard changed since (here: its modification time) has its part made again
    import os

    shard = sorted(data.glob("*.tar"))[1]
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "d"), "--no-progress"]) == 0
    m3 = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m3["shards_reused"] == 2 and m3["counts"] == m["counts"]


def test_exact_on_pair_needs_the_caption_too(tmp_path):
    data = _corpus(tmp_path)
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "d"), "--exact-on", "pair",
                 "--no-progress"]) == 0
    rows = {r["key"]: r["reason"] for r in pq.read_table(tmp_path / "d" / "duplicates.parquet").to_pylist()}
    assert rows["c21"] == "exact" and rows["c20"] == "near"  # c20: same image, other caption


def test_leaks_of_an_image_folder(tmp_path):
    from halsift.synth.leaks import near_copy
    import random

    data_dir = tmp_path / "c"
    evals = tmp_path / "evals"
    evals.mkdir()
    with ShardWriter(data_dir, maxcount=100) as w:
        for i in range(30):
            w.write(Sample(f"c{i:02d}", _png(i), f"Caption {i}.", dict(M), ext="png"))
        for j in range(10):  # near copies (crop, resize, jitter, JPEG) of evaluation images 100..109
            w.write(Sample(f"l{j}", near_copy(_png(100 + j), random.Random(j)), f"Leak {j}.", dict(M), ext="jpg"))
    for j in range(10):
        (evals / f"e{j}.png").write_bytes(_png(100 + j))
    for j in range(10, 20):
        (evals / f"e{j}.png").write_bytes(_png(200 + j))
    assert main(["dedup", "--data", str(data_dir), "--out", str(tmp_path / "d"), "--against", str(evals),
                 "--no-progress"]) == 0
    rows = pq.read_table(tmp_path / "d" / "duplicates.parquet").to_pylist()
    assert {(r["key"], r["matched"]) for r in rows if r["reason"] == "eval"} == {(f"l{j}", f"e{j}.png")
                                                                              for j in range(10)}
    assert [r for r in rows if r["reason"] != "eval"] == []


@pytest.fixture(scope="module")
def leaky_world(tmp_path_factory):
    from halsift.synth.world import generate_world

    root = tmp_path_factory.mktemp("leaky")
    world = generate_world(root / "w", images=120, seed=11, leaks=0.4, exact_copies=5, retrieval_images=30,
                           bench_images=4, t2i_prompts=0, pretrain_images=0, shard_size=50)
    return root / "w", world


def test_world_leaks_and_copies_are_found(leaky_world, tmp_path):
    w, world = leaky_world
    assert main(["dedup", "--data", str(w / "corpus"), "--out", str(tmp_path / "d"),
                 "--against", str(w / "retrieval"), "--against", str(w / "bench" / "bench.jsonl"),
                 "--no-progress"]) == 0
    rows = pq.read_table(tmp_path / "d" / "duplicates.parquet").to_pylist()
    leaks = {r["key"]: r["matched"] for r in rows if r["reason"] == "eval"}
    assert leaks == world["leaks"] and len(leaks) == 12  # every leak, nothing clean
    exact = {r["key"]: r["matched"] for r in rows if r["reason"] == "exact"}
    assert exact == world["exact_copies"]
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert [a["images"] for a in m["against"]] == [30, 4] and m["samples"] == 137


def test_leaks_of_a_clip_benchmark_export(leaky_world, tmp_path):
    from halsift.corpus.clip_benchmark_wds import export_retrieval

    w, world = leaky_world
    export_retrieval(w / "retrieval", tmp_path / "wds", maxcount=7)
    assert main(["dedup", "--data", str(w / "corpus"), "--out", str(tmp_path / "d"), "--against",
                 str(tmp_path / "wds"), "--no-progress"]) == 0
    rows = pq.read_table(tmp_path / "d" / "duplicates.parquet").to_pylist()
    leaks = {r["key"]: r["matched"] for r in rows if r["reason"] == "eval"}
    want = {k: f"test/s{int(v[len('images/r'):-len('.png')]):07d}" for k, v in world["leaks"].items()}
    assert leaks == want


def test_world_without_leaks_is_unchanged(tmp_path):
    from halsift.synth.world import generate_world

    a = generate_world(tmp_path / "a", images=20, seed=3, bench_images=2, t2i_prompts=0, retrieval_images=3,
                       pretrain_images=0)
    b = generate_world(tmp_path / "b", images=20, seed=3, bench_images=2, t2i_prompts=0, retrieval_images=3,
                       pretrain_images=0, leaks=0.0, exact_copies=0)
    assert "leaks" not in a and a == b
    for f in sorted((tmp_path / "a").rglob("*")):
        if f.is_file():
            assert f.read_bytes() == (tmp_path / "b" / f.relative_to(tmp_path / "a")).read_bytes(), f


def test_against_that_is_not_an_image_set_is_one_line(tmp_path, capsys):
    data = _corpus(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "d"), "--against", str(notes)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an image set" in err[0] and "notes.txt" in err[0]


def test_embeddings_and_model_paths_agree(tmp_path, monkeypatch):
    from halsift.filtering.curation import encode

    loads = []
    real = encode.ImageEncoder.__init__

    def counted(self, spec):
        loads.append(spec)
        real(self, spec)

    monkeypatch.setattr(encode.ImageEncoder, "__init__", counted)
    monkeypatch.setattr(encode, "_ENCODERS", {})  # no model another test of this process loaded
    data = _corpus(tmp_path)
    spec = "clip:arch=halsift-tiny,pretrained=random,seed=1"
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "m"), "--model", spec, "--cosine", "0.999",
                 "--no-progress"]) == 0
    assert loads == [spec]  # the shard parts and the global step share one model
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "e"), "--embeddings",
                 str(tmp_path / "m" / "embeddings"), "--cosine", "0.999", "--no-progress"]) == 0
    a = pq.read_table(tmp_path / "m" / "duplicates.parquet").to_pylist()
    b = pq.read_table(tmp_path / "e" / "duplicates.parquet").to_pylist()
    assert a == b and {r["key"] for r in a} >= {"c20", "c21"}
    m = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert m["model"] == spec and m["pairs"]["embedding_pairs"] >= 2


def test_hamming_pairs_equal_brute_force():
    from halsift.filtering.curation.search import hamming_pairs

    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (300, 8), dtype=np.uint8)
    flips = np.unpackbits(base, axis=1)
    for i in range(0, 300, 3):  # rows i+1, i+2: i with 1..6 bits flipped
        for d, r in ((2, i + 1), (6, i + 2)):
            flips[r] = flips[i]
            flips[r, rng.choice(64, d, replace=False)] ^= 1
    hashes = np.packbits(flips, axis=1)
    bits = np.unpackbits(hashes, axis=1).astype(np.int32)
    dist = (bits[:, None, :] != bits[None, :, :]).sum(-1)
    for t in (0, 2, 4, 7):
        want = {(i, j) for i, j in zip(*np.nonzero(dist <= t)) if i < j}
        for chunks in (None, 1, 2, 3, 4, 5, 8):  # the default for 300 hashes, and every chunking a size may pick
            if chunks == 1 and t > 2:
                continue  # one 64-bit chunk probes sum(C(64, k), k <= t) buckets: right, but slow
            a, b, d = hamming_pairs(hashes, t, chunks=chunks)
            assert set(zip(a.tolist(), b.tolist())) == want, (t, chunks)
            assert all(dist[x, y] == z for x, y, z in zip(a, b, d))


def test_cosine_pairs_on_disk_equal_the_in_memory_index(tmp_path, monkeypatch):
    # the inverted lists in a memory-mapped file (built from several blocks) give the same pairs as the in-memory
    # index, which finds every planted pair; the block files are gone afterwards, the lists file is what stays
    from halsift.filtering.curation import search

    rng = np.random.default_rng(3)
    v = rng.normal(size=(3000, 32)).astype(np.float32)
    v[1::2] = v[0::2] + 0.05 * rng.normal(size=(1500, 32)).astype(np.float32)  # 1500 planted near pairs
    v /= np.linalg.norm(v, axis=1, keepdims=True)

    def chunks():
        return (v[i:i + 700] for i in range(0, len(v), 700))

    monkeypatch.setattr(search, "BLOCK_BYTES", 4 * 32 * 1000)  # blocks of 1000 vectors: 3 blocks merged
    kw = dict(nlist=20, nprobe=4, seed=0)
    mem = search.cosine_pairs(chunks, len(v), 32, 0.95, **kw)
    disk = search.cosine_pairs(chunks, len(v), 32, 0.95, spill_dir=tmp_path / "ivf", on_disk_rows=0, **kw)
    got = lambda r: {(int(a), int(b)): float(c) for a, b, c in zip(*r)}  # noqa: E731
    assert got(mem).keys() == got(disk).keys()
    assert len({(i, i + 1) for i in range(0, 3000, 2)} & got(mem).keys()) >= 0.95 * 1500
    np.testing.assert_allclose([got(disk)[k] for k in got(mem)], list(got(mem).values()), atol=1e-6)
    assert sorted(p.name for p in (tmp_path / "ivf").iterdir()) == ["lists.ivfdata"]


def test_embeddings_of_another_width_are_one_line(tmp_path, capsys):
    """A store whose model encodes --against images at another width than its vectors: one line, exit 2."""
    from halsift.corpus.embedding_store import IMAGE, embedding_table, write_embedding_part

    data = _corpus(tmp_path)
    emb = tmp_path / "emb"
    emb.mkdir()
    keys = [f"c{i:02d}" for i in range(20)]
    write_embedding_part(embedding_table(keys, [IMAGE] * 20, np.eye(20, 8, dtype=np.float32) + 0.1),
                         emb / "part-000000.parquet")
    (emb / "_manifest.json").write_text(json.dumps({"format": "halsift-embeddings/1", "dim": 8, "complete": True,
                                                    "model": "clip:arch=halsift-tiny,pretrained=random,seed=1"}))
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "e.png").write_bytes(_png(5))
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "d"), "--embeddings", str(emb),
                 "--against", str(evals), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--against images" in err[0] and "expected 8" in err[0], err


def test_a_damaged_clip_benchmark_shard_is_counted_after_its_readable_images(leaky_world, tmp_path):
    """--against reads CLIP_benchmark shards with the shard reader: a shard cut short yields the images before the
    damage and is counted as corrupt_shard, and the other shards are read whole."""
    from halsift.corpus.clip_benchmark_wds import export_retrieval
    from halsift.corpus.images import SkipCounter
    from halsift.filtering.curation.against import iter_images

    export_retrieval(leaky_world[0] / "retrieval", tmp_path / "wds", maxcount=7)
    whole = [i for i, _ in iter_images(tmp_path / "wds", SkipCounter())]
    shard = tmp_path / "wds" / "test" / "0.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2 + 100])  # not whole 512-byte blocks: cut inside a member
    skipped = SkipCounter()
    got = [i for i, _ in iter_images(tmp_path / "wds", skipped)]
    first = [i for i in whole if i.startswith("test/")][:7]
    assert 0 < len(set(first) & set(got)) < 7 and set(got) - set(first) == set(whole) - set(first)
    assert skipped.counts["corrupt_shard"] >= 1
    assert [e["key"] for e in skipped.examples if e["kind"] == "corrupt_shard"] == [str(shard)]
