"""The synthetic world: layout, determinism, ground truth that matches the scene graph, CLI."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from halsift.corpus.bench import read_bench
from halsift.corpus.shards import iter_samples, read_sizes
from halsift.synth.scene import CELLS, COLOURS, NUMBER_WORDS, SIGN_WORDS
from halsift.synth.text import COLOUR_SYNONYMS, DIR_WORDS
from halsift.synth.world import generate_world
from halsift.launch.cli import main

COLOUR_OF = {**{c: c for c in COLOURS}, **{v: k for k, v in COLOUR_SYNONYMS.items()}}


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout(synth_world):
    w = synth_world
    for part in ("corpus", "bench/bench.jsonl", "bench/images", "retrieval/retrieval.jsonl", "pretrain",
                 "world.json"):
        assert (w / part).exists(), part
    assert not list(w.glob(".world.tmp*"))
    world = json.loads((w / "world.json").read_text())
    assert world["seed"] == 0 and world["sizes"]["corpus"] == 160
    gens = world["generators"]
    assert sum(g["generator_type"] == "i2t" for g in gens.values()) == 6
    assert sum(g["generator_type"] == "t2i" for g in gens.values()) == 3
    rates = sorted(g["incorrect_rate"] for g in gens.values() if g["generator_type"] == "i2t")
    assert rates[0] <= 0.06 and rates[-1] >= 0.3


def test_same_seed_identical_other_seed_differs(tmp_path, synth_world):
    a, b = tmp_path / "a", tmp_path / "b"
    generate_world(a, images=160, seed=0)
    generate_world(b, images=160, seed=1)
    ha, hw = _hashes(a), _hashes(synth_world)
    assert ha == hw and len(ha) > 100
    hb = _hashes(b)
    assert hb.keys() == ha.keys()
    assert sum(ha[k] != hb[k] for k in ha) > 0.9 * len(ha)


def test_worker_processes_write_the_same_bytes(tmp_path, synth_world, monkeypatch):
    """The corpus and pretrain samples made across worker processes (windows smaller than the world, so several)
    are the bytes of the world made in this process, planted copies and cut captions included."""
    import halsift.synth.world as world

    monkeypatch.setattr(world._SamplePool, "WINDOW", 64)
    kw = dict(images=160, seed=0, leaks=0.2, exact_copies=3, corpus_sentences=[2, 3], pretrain_images=150)
    generate_world(tmp_path / "one", workers=1, **kw)
    generate_world(tmp_path / "two", workers=2, **kw)
    one, two = _hashes(tmp_path / "one"), _hashes(tmp_path / "two")
    assert one == two and sum(k.startswith(("corpus/", "pretrain/")) for k in one) >= 2
    assert world.default_workers(world.PARALLEL_FROM // 2 - 1) == 1  # and pretrain as many


def test_corpus_shards_read_back(synth_world):
    samples = list(iter_samples(synth_world / "corpus"))
    assert len(samples) == 160 == sum(read_sizes(synth_world / "corpus").values())
    captioners = {s.captioner for s in samples}
    assert len(captioners) == 6
    for s in samples:
        assert s.source == "i2t" and s.ext == "png" and s.image[:8] == b"\x89PNG\r\n\x1a\n"
        sents = s.meta["sentences"]
        assert s.caption == " ".join(x["text"] for x in sents)
        assert [x["position"] for x in sents] == list(range(len(sents)))
        assert {"scene", "domain", "image_id"} <= s.meta.keys()


def test_pretrain_all_correct(synth_world):
    samples = list(iter_samples(synth_world / "pretrain"))
    assert len(samples) == 160
    labels = {x["label"] for s in samples for x in s.meta["sentences"]}
    assert labels == {"correct"}


def test_pretrain_is_web_alt_text(synth_world):
    """The base CLIP's captions name shapes by colour only (never a place, count, size or facing), mostly of
    shapes in the image; the json keeps a clean detailed caption for the VLM captioner."""
    samples = list(iter_samples(synth_world / "pretrain"))
    places = {w for _, words in CELLS for w in words.split()} | {"left", "right", "above", "below"}
    numbers = set(NUMBER_WORDS.values()) | {"small", "large", "facing"}
    named = present = 0
    for s in samples:
        words = set(s.caption.replace(",", " ").split())
        assert not words & (places | numbers), s.caption
        assert len(s.caption.split()) <= 12
        assert s.meta["detailed"] == " ".join(x["text"] for x in s.meta["sentences"])
        scene = {(g["colour"], g["shape"]) for g in s.meta["scene"]["groups"]}
        for colour, shape in re.findall(r"(\w+) (circle|square|triangle|star|diamond|hexagon)\b", s.caption):
            named += 1
            present += (colour, shape) in scene
    assert 0.75 < present / named < 0.95  # loosely paired: about one caption in four names an absent shape


def test_retrieval_captions_by_held_out_captioners(tmp_path, synth_world):
    rows = [json.loads(l) for l in (synth_world / "retrieval" / "retrieval.jsonl").read_text().splitlines()]
    assert len(rows) == 20
    for r in rows:
        assert len(r["captions"]) == len(r["captioners"]) == 5
        assert all(1 <= c.count(". ") + 1 <= 4 for c in r["captions"])  # 2-3 sentences (short scenes: fewer)
    generate_world(tmp_path / "w", images=10, bench_images=2, t2i_prompts=1, retrieval_images=30,
                   pretrain_images=2, captioners=["share-sim"])
    rows = [json.loads(l) for l in (tmp_path / "w" / "retrieval" / "retrieval.jsonl").read_text().splitlines()]
    writers = {c for r in rows for c in r["captioners"]}
    assert "share-sim" not in writers and len(writers) >= 4  # the corpus captioner never writes retrieval captions


def test_retrieval_human_style_families_of_look_alikes(tmp_path):
    generate_world(tmp_path / "w", images=10, bench_images=2, t2i_prompts=1, retrieval_images=20,
                   pretrain_images=2, retrieval_style="human")
    rows = [json.loads(l) for l in (tmp_path / "w" / "retrieval" / "retrieval.jsonl").read_text().splitlines()]
    assert len(rows) == 20
    families: dict[int, list[dict]] = {}
    np_ = r"(one|two|three) (small|large) (\w+) (circle|square|triangle|star|diamond|hexagon)s?"
    place = r"(?:in the|at the|on the) ([a-z ]+?)"
    np_place = re.compile(rf"\b{np_} {place}(?=[,.]| and | with )")
    place_np = re.compile(rf"(?:^|, ){place} {np_}(?=[,.])")
    place_of = {words: c for c, (_, words) in enumerate(CELLS)}
    for r in rows:
        assert len(r["captions"]) == 5 and all(c.strip() for c in r["captions"])
        assert (tmp_path / "w" / "retrieval" / r["image"]).is_file()
        families.setdefault(r["family"], []).append(r)
        groups = {(g["colour"], g["shape"]): g for g in r["scene"]["groups"]}
        for cap in r["captions"]:
            stated = np_place.findall(cap.lower()) + [(*m[1:], m[0]) for m in place_np.findall(cap.lower())]
            assert stated, cap
            for count, size, colour, shape, place in stated:  # every stated group, count, size and place holds
                g = groups[(colour, shape)]
                assert (NUMBER_WORDS[g["count"]], g["size"], g["cell"]) == (count, size, place_of[place]), cap
    for members in families.values():
        assert len(members) == 5
        kinds = {frozenset((g["colour"], g["shape"]) for g in m["scene"]["groups"]) for m in members}
        assert len(kinds) == 1  # same shapes and colours ...
        layouts = {tuple(sorted((g["cell"], g["count"]) for g in m["scene"]["groups"])) for m in members}
        assert len(layouts) > 1  # ... placed and counted anew


def test_bench_validates_and_has_t2i(synth_world):
    rows = read_bench(synth_world / "bench" / "bench.jsonl")
    assert all((synth_world / "bench" / r.image).is_file() for r in rows)
    assert {r.split for r in rows} == {"train", "val", "test"}
    # an image never straddles splits
    split_of = {}
    for r in rows:
        assert split_of.setdefault(r.image_id, r.split) == r.split
    t2i = [r for r in rows if r.generator_type == "t2i"]
    assert len({r.generator for r in t2i}) == 3
    by_caption = {}
    for r in t2i:
        by_caption.setdefault(r.caption_id, []).append(r)
    assert all(3 <= len(v) <= 4 for v in by_caption.values())
    t2i_types = {t for r in t2i for t in r.types}
    assert {"Direction", "Number"} <= t2i_types
    # each t2i direction error flips the direction word the prompt states
    for r in t2i:
        if "Direction" in r.types:
            words = r.sentence.split()
            assert any(words[a].strip(",.") in DIR_WORDS.values() for a, b in r.spans)
    for r in rows:
        for a, b in r.spans:
            assert b <= len(r.sentence.split())
        assert (r.label == "incorrect") == bool(r.types)
        assert (r.label == "incorrect") == bool(r.spans)


def _scene_of_bench(world: Path) -> dict:
    """i2t bench image id -> scene graph, rebuilt from the same per-image seeds the world used."""
    import random

    from halsift.synth.scene import sample_scene

    return {f"b{i:06d}": sample_scene(random.Random(f"0/bench/{i}")) for i in range(40)}


def test_spans_point_at_wrong_words(synth_world):
    rows = [r for r in read_bench(synth_world / "bench" / "bench.jsonl") if r.generator_type == "i2t"]
    scenes = _scene_of_bench(synth_world)
    checked = {"Attribute": 0, "Direction": 0, "Text": 0, "Location": 0}
    for r in rows:
        if r.label != "incorrect":
            continue
        scene = scenes[r.image_id]
        words = r.sentence.split()
        wrong = [w.strip('",.').lower() for a, b in r.spans for w in words[a:b]]
        if r.types == ["Attribute"]:
            colours = [COLOUR_OF[w] for w in wrong if w in COLOUR_OF]
            if colours and r.position > 0:  # a wrong colour: no group of that shape has that colour
                assert not any(g.colour == colours[0] and re.search(g.shape[:3], r.sentence.lower())
                               for g in scene.groups), r.sentence
                checked["Attribute"] += 1
            elif not colours:
                assert set(wrong) <= {"small", "large"}, r.sentence
        elif r.types == ["Direction"]:
            assert len(wrong) == 1 and wrong[0] in DIR_WORDS.values()
            checked["Direction"] += 1
        elif r.types == ["Text"]:
            assert len(wrong) == 1 and wrong[0].upper() in SIGN_WORDS
            assert scene.sign is None or wrong[0].upper() != scene.sign.text
            checked["Text"] += 1
        elif r.types == ["Location"]:
            assert " ".join(wrong) in {c[1] for c in CELLS}
            checked["Location"] += 1
    assert all(v > 0 for v in checked.values()), checked
    # correct sentences naming a colour + shape name a group that exists
    matched = 0
    for r in rows:
        if r.label == "correct" and r.position > 0:
            m = re.match(r"^The (\w+) (circle|square|triangle|star|diamond|hexagon)s? (is|are) facing (\w+)",
                         r.sentence)
            if m:
                g = [g for g in scenes[r.image_id].groups if g.colour == COLOUR_OF.get(m.group(1))
                     and g.shape == m.group(2)]
                assert len(g) == 1 and DIR_WORDS[g[0].facing] == m.group(4).rstrip(",.")
                matched += 1
    assert matched >= 20


def test_cli_synth_and_bad_flags(tmp_path, capsys):
    out = tmp_path / "w"
    assert main(["synth", "--out", str(out), "--images", "12", "--bench-images", "4", "--t2i-prompts", "2",
                 "--retrieval-images", "5", "--pretrain-images", "6", "--shard-size", "5", "--seed", "3"]) == 0
    assert read_bench(out / "bench" / "bench.jsonl")
    assert sum(read_sizes(out / "corpus").values()) == 12 and len(list((out / "corpus").glob("*.tar"))) == 3
    assert main(["synth", "--out", str(out), "--images", "12"]) == 2  # exists, no --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert main(["synth", "--out", str(out), "--images", "12", "--overwrite", "--pretrain-images", "2"]) == 0
    assert sum(read_sizes(out / "pretrain").values()) == 2
    assert main(["synth", "--out", str(tmp_path / "x"), "--images", "0"]) == 2
    assert main(["synth", "--out", str(tmp_path / "x"), "--image-size", "8"]) == 2
    with pytest.raises(SystemExit, match="^2$") as e:
        main(["synth", "--out", str(tmp_path / "x"), "--images", "many"])
    assert e.value.code == 2
    with pytest.raises(SystemExit, match="^2$") as e:
        main(["synth", "--images", "3"])  # --out is required
    assert e.value.code == 2


def test_corpus_captioners_option(tmp_path):
    world = generate_world(tmp_path / "w", images=30, seed=0, bench_images=2, t2i_prompts=1, retrieval_images=5,
                           pretrain_images=3, captioners=["share-sim"])
    assert world["corpus_captioners"] == ["share-sim"]
    assert {s.captioner for s in iter_samples(tmp_path / "w" / "corpus")} == {"share-sim"}
    assert len({r.generator for r in read_bench(tmp_path / "w" / "bench" / "bench.jsonl")}) == 9  # bench: all
    with pytest.raises(ValueError, match="captioners: unknown 'bard-sim'"):
        generate_world(tmp_path / "x", images=10, captioners=["bard-sim"])
    assert main(["synth", "--out", str(tmp_path / "y"), "--images", "10", "--captioners", "bard-sim"]) == 2


def test_corpus_sentences_cuts_each_corpus_caption_to_a_window(tmp_path):
    kw = dict(images=40, seed=0, bench_images=2, t2i_prompts=1, retrieval_images=5, pretrain_images=3,
              captioners=["share-sim"])
    whole = {s.key: s for s in iter_samples(generate_world(tmp_path / "a", **kw) and tmp_path / "a" / "corpus")}
    world = generate_world(tmp_path / "b", corpus_sentences=[2, 3], **kw)
    assert world["corpus_sentences"] == [2, 3]
    starts = set()
    for s in iter_samples(tmp_path / "b" / "corpus"):
        sents, full = s.meta["sentences"], whole[s.key].meta["sentences"]
        assert 2 <= len(sents) <= 3 and [x["position"] for x in sents] == list(range(len(sents)))
        assert s.caption == " ".join(x["text"] for x in sents)
        pairs = [(x["text"], x["label"]) for x in full]  # consecutive sentences of the same caption, labels kept
        at = [i for i in range(len(full)) if pairs[i:i + len(sents)] == [(x["text"], x["label"]) for x in sents]]
        assert at
        starts.add(at[0])
    assert len(starts) > 3  # windows start anywhere, not only at the overview
    bench = [(tmp_path / w / "bench" / "bench.jsonl").read_bytes() for w in ("a", "b")]
    assert bench[0] == bench[1]  # only the corpus changes
    assert main(["synth", "--out", str(tmp_path / "c"), "--images", "10", "--corpus-sentences", "3", "2"]) == 2
