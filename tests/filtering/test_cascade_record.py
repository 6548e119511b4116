"""Nothing silently wrong in the cascade (issue 51): its frozen plan is part of its record (a changed or unreadable
plan is refit to the same scores, or refused where another folder's plan is read), its identity and everything its
spec names are checked before any stage runs (a refused run spends no judge call and rewrites nothing), its stage
folders are no score folders for any reader, and a finished cascade folder moved or copied reruns with no judge
call and the same parts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from file_ids import file_id
from filtering_data import make_bench, make_corpus
from registered import counting_oracle, registered

from halsift.launch.cli import main


RecordOracle = counting_oracle("recordoracle")  # the oracle, counting the units it is asked to score


@pytest.fixture(autouse=True, scope="module")
def _family():
    with registered("recordoracle", RecordOracle):
        yield


CHEAP = "ensemble:members=[oracle;random:seed=0],weights=[0.1,0.9]"
SPEC = f"cascade:cheap=[{CHEAP}],judge=[recordoracle],budget=0.3,keep=0.2"


def _score(spec, data, out, capsys=None) -> tuple[int, str]:
    """Exit code and stderr of one score command (stdout stays in ``capsys`` for the caller)."""
    RecordOracle.calls.clear()
    if capsys is not None:
        capsys.readouterr()
    rc = main(["score", "--detector", spec, "--data", str(data), "--out", str(out), "--batch-size", "16",
               "--no-progress"])
    if capsys is None:
        return rc, ""
    got = capsys.readouterr()
    print(got.out, end="")  # back to capsys, for the caller's readouterr().out
    return rc, got.err


def _parts(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("part-*.parquet"))}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A corpus and a finished cascade folder of it."""
    root = tmp_path_factory.mktemp("cascade_record")
    data = make_corpus(root / "c", shards=3, per_shard=30, seed=7)
    assert _score(SPEC, data, root / "out")[0] == 0
    return data, root / "out"


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to, copy_function=shutil.copy)  # new mtimes, like a plain `cp -r`
    return to


@pytest.mark.parametrize("tamper", ["band", "knots", "cut", "empty", "not_json", "no_record"])
def test_a_changed_or_unreadable_plan_is_fitted_again_to_the_same_scores(finished, tmp_path, tamper, capsys):
    data, src = finished
    out = _copy(src, tmp_path / "out")
    plan_path = out / "_cascade" / "plan.json"
    plan = json.loads(plan_path.read_text())
    if tamper == "band":
        plan["band"] = [-1000, 1000]  # every unit in the band: the judge on 100% at a 30% budget
    elif tamper == "knots":
        plan["judge_knots"] = [0.0 for _ in plan["judge_knots"]]
    elif tamper == "cut":
        plan["cut"] = plan["cut"] + 30
    if tamper == "empty":
        plan_path.write_text("{}")
    elif tamper == "not_json":
        plan_path.write_text("{ this is not json")
    elif tamper == "no_record":
        (out / "_cascade" / "_done" / "plan.json.json").unlink()
    else:
        plan_path.write_text(json.dumps(plan))
    rc, _ = _score(SPEC, data, out, capsys)
    out_text = capsys.readouterr().out
    assert rc == 0 and RecordOracle.calls == []  # the stored sample refits it: no judge call
    assert "is not the plan this folder fitted" in out_text or tamper == "no_record"
    assert _parts(out) == _parts(src)  # the untampered scores
    assert json.loads(plan_path.read_text()) == json.loads((src / "_cascade" / "plan.json").read_text())


@pytest.mark.parametrize("tamper", ["band", "not_json"])
def test_calibration_through_a_changed_plan_is_refused_naming_the_file(finished, tmp_path, tamper, capsys):
    data, src = finished
    out = _copy(src, tmp_path / "out")
    plan_path = out / "_cascade" / "plan.json"
    if tamper == "band":
        plan_path.write_text(json.dumps({**json.loads(plan_path.read_text()), "band": [-1000, 1000]}))
    else:
        plan_path.write_text("nope")
    bench = make_bench(tmp_path / "bench", captions=6)
    rc, err = _score(f"{SPEC},plan={out}", bench, tmp_path / "cal", capsys)
    assert rc == 2 and str(plan_path) in err and "not the plan its cascade folder recorded" in err
    assert RecordOracle.calls == [] and len(err.strip().splitlines()) == 1


def test_another_seed_is_refused_before_any_stage_and_rewrites_nothing(finished, tmp_path, capsys):
    data, src = finished
    out = _copy(src, tmp_path / "out")
    stamps = {p.relative_to(out): file_id(p) for p in out.rglob("*") if p.is_file() and p.name != "_manifest.json"}
    rc, err = _score(SPEC + ",seed=3", data, out, capsys)
    assert rc == 2 and "holds scores with a different detector" in err and RecordOracle.calls == []
    assert {p.relative_to(out): file_id(p) for p in out.rglob("*") if p.is_file()
            and p.name != "_manifest.json"} == stamps
    assert json.loads((out / "_manifest.json").read_text())["status"] == "complete"  # the run never started
    assert _score(SPEC, data, out)[0] == 0 and RecordOracle.calls == []  # the original command judges nothing


@pytest.mark.parametrize("spec, needle", [
    (f"cascade:cheap=[{CHEAP}],judge=[lora:/nonexistent/adapter],budget=0.3", "judge: lora:/nonexistent/adapter option path=/nonexistent/adapter does not exist"),
    ("cascade:cheap=[clip:arch=halsift-tiny,checkpoint=/nonexistent/w.safetensors],judge=[recordoracle]",
     "option checkpoint=/nonexistent/w.safetensors does not exist"),
    (f"cascade:cheap=[{CHEAP}],judge=[recordoracle],budget=0.01,sample=0.01", "draws 0 of the at most"),
    (f"cascade:cheap=[{CHEAP}],judge=[recordoracle],budget=0.3,learn=/nonexistent/emb", "learn=/nonexistent/emb is "
                                                                                        "not a `halsift embed`"),
])
def test_what_a_spec_names_is_refused_before_the_cheap_pass(finished, tmp_path, spec, needle, capsys):
    data, _ = finished
    rc, err = _score(spec, data, tmp_path / "out", capsys)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out" / "_stages").exists() and RecordOracle.calls == []


def test_a_learn_sample_under_its_minimum_is_refused_before_the_cheap_pass(finished, tmp_path, capsys):
    data, _ = finished
    emb = tmp_path / "emb"
    assert main(["embed", "--model", "clip:arch=halsift-tiny,pretrained=random", "--data", str(data), "--out",
                 str(emb), "--no-progress"]) == 0
    rc, err = _score(f"cascade:cheap=[{CHEAP}],judge=[recordoracle],budget=0.3,sample=0.2,learn={emb}", data,
                     tmp_path / "out", capsys)
    assert rc == 2 and "at least 50 needed to fit learn='s head" in err and not (tmp_path / "out" / "_stages").exists()


@pytest.mark.parametrize("command", ["select", "annotate", "teacher"])
def test_a_cascade_stage_folder_is_no_score_folder_for_any_reader(finished, tmp_path, command, capsys):
    data, src = finished
    stage = src / "_stages" / "sample"
    argv = {"select": ["select", "--scores", str(stage), "--data", str(data), "--out", str(tmp_path / "o"),
                       "--keep", "0.2", "--no-progress"],
            "annotate": ["annotate", "--scores", str(stage), "--data", str(data), "--out", str(tmp_path / "o"),
                         "--n", "10"],
            "teacher": ["train", "detector", "--teacher", str(stage), "--embeddings", str(tmp_path / "emb"),
                        "--out", str(tmp_path / "o")]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is a cascade stage folder" in err and str(src) in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_readers_refuse_a_folder_of_another_corpus_with_the_same_keys(tmp_path, capsys):
    a = make_corpus(tmp_path / "a", shards=2, per_shard=8, seed=1)
    b = make_corpus(tmp_path / "b", shards=2, per_shard=8, seed=2)  # the same keys, other samples
    assert main(["score", "--detector", "random:seed=0", "--data", str(b), "--out", str(tmp_path / "sb"),
                 "--no-progress"]) == 0
    assert main(["annotate", "--scores", str(tmp_path / "sb"), "--data", str(a), "--out", str(tmp_path / "page"),
                 "--n", "5"]) == 2
    assert "is not the shard" in capsys.readouterr().err and not (tmp_path / "page").exists()
    assert main(["embed", "--model", "clip:arch=halsift-tiny,pretrained=random", "--data", str(a), "--out",
                 str(tmp_path / "ea"), "--no-progress"]) == 0
    assert main(["train", "detector", "--teacher", str(tmp_path / "sb"), "--embeddings", str(tmp_path / "ea"),
                 "--out", str(tmp_path / "student")]) == 2
    err = capsys.readouterr().err
    assert "--embeddings:" in err and "was made from another shard" in err and not (tmp_path / "student").exists()


def test_a_copied_cascade_folder_reruns_with_no_judge_call_and_the_same_parts(finished, tmp_path):
    data, src = finished
    out = _copy(src, tmp_path / "moved")
    before = {p.name: file_id(p) for p in out.glob("part-*.parquet")}
    assert _score(SPEC, data, out)[0] == 0 and RecordOracle.calls == []
    assert _parts(out) == _parts(src)
    assert {p.name: file_id(p) for p in out.glob("part-*.parquet")} == before  # not even rewritten
    m = json.loads((out / "_manifest.json").read_text())
    assert m["status"] == "complete" and m["cascade"]["judge_calls"] > 0  # what the folder spent, once
