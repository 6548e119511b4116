"""`stats` recovers the designed rates of the synthetic world; the table and CLI work."""

from __future__ import annotations

import json

import pytest

from halsift.corpus.bench import TYPES
from halsift.corpus.stats import format_table, stats
from halsift.synth.captioners import PROFILES
from halsift.synth.world import generate_world
from halsift.launch.cli import main


@pytest.fixture(scope="module")
def big_bench(tmp_path_factory):
    """~2000 labelled sentences per captioner (bench only: tiny corpus / pretrain / retrieval)."""
    out = tmp_path_factory.mktemp("statsworld")
    generate_world(out, images=1, seed=7, bench_images=320, t2i_prompts=150, retrieval_images=0,
                   pretrain_images=0, image_size=32)
    return out


def test_designed_rates_recovered(big_bench):
    st = stats(big_bench / "bench" / "bench.jsonl")
    gens = st["generators"]
    world = json.loads((big_bench / "world.json").read_text())
    for prof in PROFILES:
        g = gens[prof.name]
        assert g["sentences"] > 1000
        # binomial sd of the rate is <= 1.5 points here; allow ~3 sd
        assert abs(g["incorrect_rate"] - 100 * prof.incorrect_rate) < 4.5, (prof.name, g["incorrect_rate"])
        assert abs(g["pct_unknown"] - 100 * prof.unknown_rate * (1 - 1 / g["sentences_per_image"])) < 2.5
        lo, hi = prof.sentences
        assert abs(g["sentences_per_image"] - (lo + hi) / 2) < 0.4
        n_inc = sum(g["types"].values())
        mix = world["generators"][prof.name]["type_mix"]
        if prof.incorrect_rate >= 0.15:  # enough incorrect sentences for the type mix
            for t in TYPES:
                assert abs(g["types"][t] / n_inc - mix[t]) < 0.06, (prof.name, t)
        pos = g["incorrect_rate_by_position"]
        first, middle = pos["0"], sum(pos[str(p)] for p in (1, 2, 3)) / 3
        if prof.incorrect_rate >= 0.08:
            assert first < 0.6 * middle, (prof.name, pos)
    # styles differ: sentence counts and words per sentence are not all the same
    assert len({round(gens[p.name]["sentences_per_image"]) for p in PROFILES}) >= 4
    # t2i generators: 3-4 sentences, direction and count mistakes, ordered by their designed mistake rates
    t2i = {n: g for n, g in gens.items() if g["generator_type"] == "t2i"}
    assert len(t2i) == 3
    for g in t2i.values():
        assert 3 <= g["sentences_per_image"] <= 4
        assert g["types"]["Direction"] > 0 and g["types"]["Number"] > 0
    assert t2i["sd-sim"]["incorrect_rate"] > t2i["flux-sim"]["incorrect_rate"] > t2i["gptgen-sim"]["incorrect_rate"]
    assert t2i["gptgen-sim"]["types"]["Direction"] == max(t2i["gptgen-sim"]["types"].values())


def test_stats_on_shards_matches_json(synth_world):
    st = stats(synth_world / "corpus")
    assert st["kind"] == "shards"
    from halsift.corpus.shards import iter_samples

    n = sum(len(s.meta["sentences"]) for s in iter_samples(synth_world / "corpus"))
    inc = sum(x["label"] == "incorrect" for s in iter_samples(synth_world / "corpus") for x in s.meta["sentences"])
    assert st["generators"]["all"]["sentences"] == n
    assert st["generators"]["all"]["pct_incorrect"] == pytest.approx(100 * inc / n, abs=0.01)
    assert stats(synth_world)["kind"] == "bench"  # a world folder means its bench


def test_format_table(synth_world):
    text = format_table(stats(synth_world / "bench"))
    assert "share-sim" in text and "incorrect % at #1" in text and "Direction" in text


def test_cli_stats(synth_world, capsys, tmp_path):
    assert main(["stats", str(synth_world / "bench" / "bench.jsonl"), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert len(st["generators"]) == 10
    assert main(["stats", str(synth_world / "pretrain")]) == 0
    assert "incorrect %" in capsys.readouterr().out
    assert main(["stats", str(tmp_path / "missing")]) == 2
    bad = tmp_path / "bench.jsonl"
    bad.write_text('{"id": 1}\n')
    assert main(["stats", str(bad)]) == 2
    assert "bench.jsonl:1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="^2$") as e:
        main(["stats"])
    assert e.value.code == 2
    for argv in (["--help"], ["stats", "--help"], ["synth", "--help"]):  # help text formats ('%' escaped)
        with pytest.raises(SystemExit, match="^0$") as e:
            main(argv)
        assert e.value.code == 0
