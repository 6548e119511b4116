"""The notebook API (`import halsift`): the example of docs/commands.md, run on the tiny models."""

from __future__ import annotations

import random

import pytest
from filtering_data import png
from PIL import Image

import halsift


def test_readme_example_runs(tmp_path):
    rng = random.Random(0)
    (tmp_path / "cat.png").write_bytes(png(rng))
    images = [str(tmp_path / "cat.png"), Image.new("RGB", (40, 30), "red"), png(rng)]
    captions = ["A cat on a mat. It is blue.", "A red bus.", "Two dogs. One sleeps. The sky is grey."]
    df = halsift.score_pairs(images, captions, detector="clip:arch=halsift-tiny,pretrained=random")
    assert list(df.columns) == ["pair", "sentence_index", "sentence", "score", "parsed", "detector"]
    assert df["pair"].tolist() == [0, 0, 1, 2, 2, 2] and df["sentence_index"].tolist() == [0, 1, 0, 0, 1, 2]
    assert df["sentence"][1] == "It is blue." and df["score"].between(0, 100).all()
    assert df["detector"].iloc[0].startswith("clip:arch=halsift-tiny,pretrained=random")
    # the same pairs through the detector object give the same scores (no hidden state)
    det = halsift.load_detector("clip:arch=halsift-tiny,pretrained=random")
    again = halsift.score_pairs(images, captions, detector=det, batch_size=2)
    assert again["score"].tolist() == pytest.approx(df["score"].tolist(), abs=1e-4)
    kept = halsift.select(df, keep=0.5)
    assert len(kept) == 3 and kept["score"].is_monotonic_decreasing
    assert kept["score"].min() >= df["score"].median() - 1e-9
    whole = halsift.select(df, top_k=1, unit="caption", agg="min")
    best = df.groupby("pair")["score"].min()
    assert whole["pair"].tolist() == [int(best.idxmax())] and whole["score"][0] == pytest.approx(best.max())


def test_caption_unit_and_bad_inputs(tmp_path):
    df = halsift.score_pairs([png(random.Random(1))], ["One. Two."], detector="random:seed=0", unit="caption")
    assert df["sentence_index"].tolist() == [-1] and df["sentence"][0] == "One. Two."
    with pytest.raises(ValueError, match="differ in length"):
        halsift.score_pairs([], ["x"], detector="random:seed=0")
    with pytest.raises(ValueError, match=r"images\[0\]: cannot read"):
        halsift.score_pairs([str(tmp_path / "missing.jpg")], ["x"], detector="clip:arch=halsift-tiny,pretrained=random")


def test_each_image_is_scored_with_its_own_caption(tmp_path):
    """Scores follow a permutation of the pairs; permuting the images alone gives each caption the score of its new
    image (each pair scored on its own as the reference), which differs from its old one."""
    det = halsift.load_detector("clip:arch=halsift-tiny,pretrained=random,seed=0")
    rng = random.Random(2)
    images = [png(rng, size=48) for _ in range(4)]
    captions = ["A dog. It runs.", "A red bus.", "Two cats on a sofa. One sleeps. The sky is grey.", "A tree."]

    def alone(img, cap) -> list[float]:
        return halsift.score_pairs([img], [cap], detector=det)["score"].tolist()

    def by_pair(df) -> list[list[float]]:
        return [df.loc[df["pair"] == p, "score"].tolist() for p in range(len(captions))]

    df = halsift.score_pairs(images, captions, detector=det, batch_size=3)  # batches cut across pairs
    for p, got in enumerate(by_pair(df)):
        assert got == pytest.approx(alone(images[p], captions[p]), abs=1e-4), p
    perm = [2, 0, 3, 1]
    both = halsift.score_pairs([images[p] for p in perm], [captions[p] for p in perm], detector=det)
    assert by_pair(both) == [pytest.approx(by_pair(df)[p], abs=1e-4) for p in perm]
    swapped = by_pair(halsift.score_pairs([images[p] for p in perm], captions, detector=det, batch_size=3))
    for i, p in enumerate(perm):
        want = alone(images[p], captions[i])
        assert swapped[i] == pytest.approx(want, abs=1e-4), i
        assert max(abs(a - b) for a, b in zip(want, by_pair(df)[i])) > 1e-2, i  # the image matters to the score


def test_notebook_score_is_the_commands_job(tmp_path):
    """``halsift.score`` runs the ScoreJob the command runs: the same parts, the same manifest settings."""
    import json

    from filtering_data import make_corpus
    from halsift.corpus.scores import read_scores_df
    from halsift.launch.cli import main

    corpus = make_corpus(tmp_path / "c", shards=2, per_shard=3, seed=1)
    m = halsift.score("random:seed=0", corpus, tmp_path / "api", batch_size=4, show_progress=False)
    assert main(["score", "--detector", "random:seed=0", "--data", str(corpus), "--out", str(tmp_path / "cli"),
                 "--batch-size", "4", "--no-progress"]) == 0
    cli = json.loads((tmp_path / "cli" / "_manifest.json").read_text())
    assert m["status"] == "complete" and m["run_settings"] == cli["run_settings"] and m["sentences"] == cli["sentences"]
    a, b = (read_scores_df(tmp_path / d).sort_values(["key", "sentence_index"]).reset_index(drop=True)
            for d in ("api", "cli"))
    assert a["score"].tolist() == b["score"].tolist()


def test_the_public_namespace_is_exactly_all():
    """``import halsift`` offers what ``__all__`` names and nothing else (no ``os`` or ``Any`` leaking, the stage
    packages reached as ``halsift.<stage>``)."""
    import types

    public = {n for n, v in vars(halsift).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public == set(halsift.__all__) == {"load_detector", "score", "score_pairs", "select"}
