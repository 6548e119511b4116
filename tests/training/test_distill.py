"""Issue 44: distillation. A student head on stored embeddings, trained on a teacher's scores only (no labels),
reproduces the teacher's order on units it never saw, scores through the ``student`` family and serves as a
cascade's cheap stage."""

from __future__ import annotations

import json

import pytest
from filtering_data import make_bench, make_corpus
from scipy.stats import spearmanr

from halsift.launch.cli import main

CLIP = "clip:arch=halsift-tiny,pretrained=random"


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    corpus = make_corpus(root / "corpus", shards=2, per_shard=40, seed=7)
    assert main(["embed", "--model", CLIP, "--data", str(corpus), "--out", str(root / "emb"), "--no-progress"]) == 0
    # the teacher: a detector whose scores are a function of the stored vectors (so a student can learn them)
    assert main(["score", "--detector", f"{CLIP},embeddings={root / 'emb'}", "--data", str(corpus), "--out",
                 str(root / "teacher"), "--no-progress"]) == 0
    assert main(["train", "detector", "--teacher", str(root / "teacher"), "--embeddings", str(root / "emb"),
                 "--out", str(root / "student"), "--steps", "400", "--lr", "0.003"]) == 0
    return corpus, root


def _scores(folder):
    from halsift.corpus.scores import read_scores

    t = read_scores(folder, ["key", "sentence_index", "score"]).to_pandas()
    return t.set_index(["key", "sentence_index"])["score"]


def test_the_student_reproduces_the_teachers_order_on_held_out_units(distilled):
    corpus, root = distilled
    cfg = json.loads((root / "student" / "student" / "config.json").read_text())
    assert cfg["held_out"] > 5 and cfg["held_out_spearman"] > 0.8
    assert cfg["spec"] == f"student:path={root / 'student' / 'student'},embeddings={root / 'emb'}"
    assert main(["score", "--detector", cfg["spec"], "--data", str(corpus), "--out", str(root / "scored"),
                 "--no-progress"]) == 0
    s, t = _scores(root / "scored"), _scores(root / "teacher")
    assert len(s) == len(t) and spearmanr(s, t.loc[s.index]).statistic > 0.8


def test_without_embeddings_the_student_encodes_with_its_clip(distilled, tmp_path, capsys):
    """The stored vectors and the student's own encoding give the same scores (up to the stored float16 rounding),
    and only the encoding student scores a bench, whose rows no embeddings folder holds."""
    corpus, root = distilled
    path = root / "student" / "student"
    specs = {"stored": f"student:path={path},embeddings={root / 'emb'}", "encoded": f"student:path={path}"}
    for name, spec in specs.items():
        assert main(["score", "--detector", spec, "--data", str(corpus), "--out", str(tmp_path / name),
                     "--no-progress"]) == 0
    stored, encoded = _scores(tmp_path / "stored"), _scores(tmp_path / "encoded")
    assert len(encoded) == len(stored) == len(_scores(root / "teacher"))
    diff = (encoded - stored.loc[encoded.index]).abs()
    assert diff.max() < 0.5 and spearmanr(encoded, stored.loc[encoded.index]).statistic > 0.99
    bench = make_bench(tmp_path / "bench", captions=6, seed=3)
    assert main(["score", "--detector", f"student:path={path}", "--data", str(bench), "--out", str(tmp_path / "b"),
                 "--no-progress"]) == 0
    rows = sum(1 for line in bench.read_text().splitlines() if line.strip())
    assert len(_scores(tmp_path / "b")) == rows
    capsys.readouterr()
    assert main(["score", "--detector", f"student:path={path},embeddings={root / 'emb'}", "--data", str(bench),
                 "--out", str(tmp_path / "b2"), "--no-progress"]) == 2
    assert "no vectors for sample" in capsys.readouterr().err


def test_the_student_is_a_cascades_cheap_stage(distilled, tmp_path):
    corpus, root = distilled
    spec = json.loads((root / "student" / "student" / "config.json").read_text())["spec"]
    assert main(["score", "--detector", f"cascade:cheap=[{spec}],judge=[oracle],budget=0.5", "--data", str(corpus),
                 "--out", str(tmp_path / "cas"), "--no-progress"]) == 0
    m = json.loads((tmp_path / "cas" / "_manifest.json").read_text())
    assert 0 < m["cascade"]["judge_share"] <= 50


def test_a_teacher_without_vectors_is_one_line(distilled, tmp_path, capsys):
    _, root = distilled
    other = make_corpus(tmp_path / "other", shards=1, per_shard=6, seed=99)
    assert main(["score", "--detector", "random:seed=0", "--data", str(other), "--out", str(tmp_path / "t"),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", "detector", "--teacher", str(tmp_path / "t"), "--embeddings", str(root / "emb"),
                 "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # another corpus's shards: refused before training
    assert len(err) == 1 and "was made from another shard than --teacher" in err[0], err
