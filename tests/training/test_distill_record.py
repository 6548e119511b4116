"""Issue 51, rule 5: `train detector --teacher` keeps a run record like every other stage (``OUT/distill.json``:
the teacher's and the embeddings' manifests by content, the settings, how the run ended). The same command finds its
student; another teacher, embeddings or settings into the same --out, or an --out holding another student made
before the record, is refused in one line (it was overwritten with exit 0)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from cli_cases import _err_line
from filtering_data import make_corpus

from halsift.launch.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from test_distill import CLIP, distilled  # noqa: E402, F401 (a fixture: a corpus, its embeddings, a teacher)


@pytest.fixture(scope="module")
def taught(distilled):
    """``distilled``'s folder (corpus/, emb/, teacher/) with another teacher of the same corpus."""
    corpus, root = distilled
    if not (root / "other_teacher").exists():
        assert main(["score", "--detector", "random:seed=2", "--data", str(corpus), "--out",
                     str(root / "other_teacher"), "--no-progress"]) == 0
    return root


def _distill(root, out, *extra, teacher="teacher", emb="emb") -> list[str]:
    return ["train", "detector", "--teacher", str(root / teacher), "--embeddings", str(root / emb), "--out",
            str(out), "--steps", "20", *extra]


@pytest.fixture()
def student(taught, tmp_path, capsys):
    out = tmp_path / "student"
    assert main(_distill(taught, out)) == 0
    capsys.readouterr()
    return out


def test_the_run_record_says_what_taught_the_student(taught, student):
    rec = json.loads((student / "distill.json").read_text())
    assert rec["status"] == "complete" and rec["stage"] == "distill"
    assert rec["teacher"] == str((taught / "teacher").resolve()) and rec["teacher_fp"] and rec["embeddings_fp"]
    assert rec["settings"]["steps"] == 20 and rec["spec"].startswith("student:path=")


def test_the_same_command_again_finds_its_student(taught, student, capsys):
    before = (student / "student" / "model.safetensors").stat().st_mtime_ns
    assert main(_distill(taught, student)) == 0
    assert "trained already" in capsys.readouterr().out
    assert (student / "student" / "model.safetensors").stat().st_mtime_ns == before


def test_a_copied_teacher_is_the_same_teacher(taught, student, tmp_path, capsys):
    shutil.copytree(taught / "teacher", tmp_path / "teacher")
    assert main(["train", "detector", "--teacher", str(tmp_path / "teacher"), "--embeddings", str(taught / "emb"),
                 "--out", str(student), "--steps", "20"]) == 0
    assert "trained already" in capsys.readouterr().out


def test_a_teacher_scored_again_to_the_same_parts_is_the_same_teacher(taught, student, tmp_path, capsys):
    """The record holds the teacher's and the embeddings' parts by content: an identical rescore (or re-embed),
    which rewrites the folder's manifest with new timings, still finds the student (it was refused as another)."""
    shutil.copytree(taught / "teacher", tmp_path / "teacher")
    shutil.copytree(taught / "emb", tmp_path / "emb")
    manifest = json.loads((tmp_path / "teacher" / "_manifest.json").read_text())
    assert main(["score", "--detector", manifest["detector"], "--data", str(taught / "corpus"), "--out",
                 str(tmp_path / "teacher"), "--no-progress"]) == 0
    assert main(["embed", "--model", CLIP, "--data", str(taught / "corpus"), "--out", str(tmp_path / "emb"),
                 "--no-progress"]) == 0
    assert json.loads((tmp_path / "teacher" / "_manifest.json").read_text()) != manifest  # rewritten (timings)
    capsys.readouterr()
    assert main(["train", "detector", "--teacher", str(tmp_path / "teacher"), "--embeddings", str(tmp_path / "emb"),
                 "--out", str(student), "--steps", "20"]) == 0
    assert "trained already" in capsys.readouterr().out


@pytest.mark.parametrize("change, key", [
    ({"teacher": "other_teacher"}, "teacher_fp"),  # the probe: another student overwrote this one with exit 0
    ({"emb": "emb_edited"}, "embeddings_fp"),
    ({"extra": ("--lr", "0.01")}, "lr"),
    ({"extra": ("--teacher-sample", "12")}, "sample"),
])
def test_another_student_into_the_folder_is_refused(taught, student, capsys, change, key):
    if change.get("emb") == "emb_edited" and not (taught / "emb_edited").exists():
        # another embeddings folder of the same shards: other vectors (a model of another seed)
        assert main(["embed", "--model", f"{CLIP},seed=5", "--data", str(taught / "corpus"), "--out",
                     str(taught / "emb_edited"), "--no-progress"]) == 0
    before = (student / "student" / "model.safetensors").read_bytes()
    argv = _distill(taught, student, *change.get("extra", ()), teacher=change.get("teacher", "teacher"),
                    emb=change.get("emb", "emb"))
    assert main(argv) == 2
    line = _err_line(capsys)
    assert f"--out: {student}: holds another student with a different {key}" in line, line
    assert (student / "student" / "model.safetensors").read_bytes() == before


def test_a_folder_holding_a_student_without_a_record_is_refused(taught, tmp_path, capsys):
    out = tmp_path / "old"
    (out / "student").mkdir(parents=True)
    (out / "student" / "config.json").write_text("{}")  # a student made before the record
    assert main(_distill(taught, out)) == 2
    assert "is not empty and holds no distill.json" in _err_line(capsys)
    assert (out / "student" / "config.json").read_text() == "{}"


def test_a_teacher_of_other_data_is_refused_before_anything_is_written(taught, tmp_path, capsys):
    other = make_corpus(tmp_path / "other", shards=1, per_shard=4, seed=9)  # data the embeddings were not made of
    assert main(["score", "--detector", "random:seed=1", "--data", str(other), "--out", str(tmp_path / "t"),
                 "--no-progress"]) == 0
    out = tmp_path / "s"
    argv = ["train", "detector", "--teacher", str(tmp_path / "t"), "--embeddings", str(taught / "emb"), "--out",
            str(out), "--steps", "20"]
    capsys.readouterr()
    assert main(argv) == 2
    assert "their content differs); embed the shards the teacher scored" in _err_line(capsys)
    assert not out.exists()


def test_a_failed_run_is_left_failed_with_its_reason(taught, tmp_path, capsys):
    out = tmp_path / "s"  # a sample of 5 units: too few to train on, found once the run has started
    capsys.readouterr()
    assert main(_distill(taught, out, "--teacher-sample", "5")) == 2
    assert "5 of its 5 units have vectors in --embeddings" in _err_line(capsys)
    rec = json.loads((out / "distill.json").read_text())
    assert rec["status"] == "failed" and "have vectors" in rec["error"]


def _padded(corpus: Path, to: int) -> Path:
    """Each shard of ``corpus`` grown past 1 MiB with zero blocks after its end (still the same samples), so that a
    sampled fingerprint and a whole-file one (``score --full-hash``) differ."""
    for shard in sorted(corpus.glob("*.tar")):
        with open(shard, "ab") as f:
            f.write(b"\0" * (to - shard.stat().st_size))
    return corpus


def test_a_teacher_scored_with_full_hash_is_the_embeddings_teacher(tmp_path, capsys):
    """Issue 51's provenance check compared a whole-file fingerprint (`--full-hash`) with the embeddings' sampled one:
    shards over 1 MiB were refused as other data. Compared each its own way, the same shards pass and other shards of
    the same size are still refused."""
    corpus = _padded(make_corpus(tmp_path / "corpus", shards=1, per_shard=40, seed=7), 3 << 20)
    other = _padded(make_corpus(tmp_path / "other", shards=1, per_shard=40, seed=8), 3 << 20)
    assert main(["embed", "--model", CLIP, "--data", str(corpus), "--out", str(tmp_path / "emb"), "--no-progress"]) == 0
    for data, teacher in ((corpus, "t"), (other, "t_other")):
        assert main(["score", "--detector", "random:seed=1", "--data", str(data), "--out", str(tmp_path / teacher),
                     "--full-hash", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(_distill(tmp_path, tmp_path / "s", teacher="t")) == 0
    assert main(_distill(tmp_path, tmp_path / "s_other", teacher="t_other")) == 2
    assert "their content differs); embed the shards the teacher scored" in _err_line(capsys)
