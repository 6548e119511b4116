"""Per-shard corpus stages on the execution layer's engines: ``basic`` and dedup's per-shard part run as independent tasks
(``--num-tasks/--task-index``) give the rows of one process; a task SIGKILLed mid-part reruns to the same output; a
plain dedup run after the tasks does the global part from their parts (and makes any part they missed); each flag a
stage cannot honour is refused in one line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from halsift.launch.cli import main
from file_ids import file_ids
from kill_mid_part import kill_mid_part
from test_basic_filters import FAST, SAMPLES, _shards
from test_dedup import _corpus

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# a child process running `halsift ARGS` with one part-making function slowed down (so that a kill lands mid-part);
# with SLOW_LOG set, each call appends a line to that file (how many parts all processes made)
SLOW = """
import os, sys, time, importlib
mod, name, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
m = importlib.import_module(mod)
orig = getattr(m, name)
def slow(*a, **k):
    if os.environ.get("SLOW_LOG"):
        with open(os.environ["SLOW_LOG"], "a") as f:
            f.write(f"{os.getpid()}\\n")
    time.sleep(delay)
    return orig(*a, **k)
setattr(m, name, slow)
from halsift.launch.cli import main
sys.exit(main(sys.argv[4:]))
"""
BASIC_SLOW = ["halsift.filtering.curation.basic_run", "_one_part"]
DEDUP_SLOW = ["halsift.filtering.curation.hash_parts", "hash_shard"]


def _cmd(slow: list[str], delay: float, args: list[str]) -> list[str]:
    return [sys.executable, "-c", SLOW, *slow, str(delay), *args]


def _rows(folder: Path, pattern: str = "part-*.parquet") -> list[dict]:
    t = pa.concat_tables(pq.read_table(p) for p in sorted(folder.glob(pattern)))
    return sorted(t.to_pylist(), key=lambda r: r["key"])


def _dups(folder: Path) -> list[dict]:
    return sorted(pq.read_table(folder / "duplicates.parquet").to_pylist(), key=lambda r: r["key"])


# ------------------------------------------------------------------------------------------------ basic
def test_basic_as_two_overlapping_tasks_equals_one_process(tmp_path):
    data = _shards(tmp_path / "shards", per_shard=2)  # 4 parts
    out = tmp_path / "tasks"
    log = tmp_path / "made.log"
    procs = [subprocess.Popen(_cmd(BASIC_SLOW, 0.3, ["basic", "--data", str(data), "--out", str(out),
                                                     "--num-tasks", "2", "--task-index", str(i), *FAST]),
                              env={**ENV, "SLOW_LOG": str(log)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert len(log.read_text().split()) == 4  # the claims split the 4 parts: none made twice
    assert main(["basic", "--data", str(data), "--out", str(tmp_path / "one"), *FAST]) == 0
    m, one = (json.loads((d / "manifest.json").read_text()) for d in (out, tmp_path / "one"))
    assert m["status"] == "complete" and m["presets"] == one["presets"] and m["parts"] == one["parts"]
    assert _rows(out) == _rows(tmp_path / "one") and len(_rows(out)) == len(SAMPLES)
    assert not list((out / "_claims").iterdir())


def test_basic_task_killed_mid_part_reruns_to_identical_output(tmp_path):
    data = _shards(tmp_path / "shards", per_shard=2)
    out = tmp_path / "killed"
    cmd = _cmd(BASIC_SLOW, 1.0, ["basic", "--data", str(data), "--out", str(out), "--num-tasks", "2",
                                 "--task-index", "1", *FAST])
    kill_mid_part(cmd, ENV, out)
    assert json.loads((out / "manifest.json").read_text())["status"] == "running"
    finished = file_ids(out)
    assert len(finished) == 1  # kill_mid_part: one part written, the next claimed and unwritten
    res = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "complete" and m["parts_done_before"] == 1 and "(1 done before)" in res.stdout
    # the finished part is reused as it is (the same file and record, never rewritten); the killed part and those
    # not begun are made
    after = file_ids(out)
    assert {n: after[n] for n in finished} == finished and len(after) == len(m["parts"]) == 4
    assert main(["basic", "--data", str(data), "--out", str(tmp_path / "one"), *FAST]) == 0
    assert _rows(out) == _rows(tmp_path / "one")


def test_basic_parquet_row_groups_are_parts(tmp_path):
    rows = [{"key": k, "caption": cap, "width": w, "height": h} for k, cap, (w, h) in SAMPLES]
    rows.append({**rows[4], "caption": "A repeated key in a later row group."})  # skipped as a duplicate
    (tmp_path / "grouped").mkdir()
    (tmp_path / "whole").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "grouped" / "t.parquet", row_group_size=3)  # 3 groups
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "whole" / "t.parquet")
    for i in (1, 0):  # two tasks, the second finds the first's parts
        assert main(["basic", "--data", str(tmp_path / "grouped"), "--out", str(tmp_path / "g"), "--num-tasks", "2",
                     "--task-index", str(i), *FAST]) == 0
    assert main(["basic", "--data", str(tmp_path / "whole"), "--out", str(tmp_path / "w"), *FAST]) == 0
    g, w = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("g", "w"))
    assert g["parts"] == [f"part-t.rg{i:05d}.parquet" for i in range(3)] and w["parts"] == ["part-t.parquet"]
    assert g["status"] == "complete" and g["presets"] == w["presets"] and g["samples"] == len(SAMPLES)
    assert g["skipped"]["by_kind"] == w["skipped"]["by_kind"] == {"duplicate": 1}
    assert _rows(tmp_path / "g") == _rows(tmp_path / "w")
    # a changed row group's table: every part of it is made again (the table's content fingerprint changed)
    pq.write_table(pa.Table.from_pylist(rows[:-1][::-1]), tmp_path / "grouped" / "t.parquet", row_group_size=3)
    assert main(["basic", "--data", str(tmp_path / "grouped"), "--out", str(tmp_path / "g"), *FAST]) == 0
    assert json.loads((tmp_path / "g" / "manifest.json").read_text())["parts_done_before"] == 0
    assert _rows(tmp_path / "g") == _rows(tmp_path / "w")


# ------------------------------------------------------------------------------------------------ dedup
def test_dedup_tasks_then_plain_run_equals_one_process(tmp_path, capsys):
    data = _corpus(tmp_path)  # 3 shards
    out = tmp_path / "tasks"
    for i in (0, 1):
        assert main(["dedup", "--data", str(data), "--out", str(out), "--num-tasks", "2", "--task-index", str(i),
                     "--no-progress"]) == 0
    assert "run dedup without --num-tasks" in capsys.readouterr().out
    assert len(list((out / "_parts").glob("part-*.parquet"))) == 3 and not (out / "duplicates.parquet").exists()
    first = sorted(out.glob("_parts/part-*.parquet"))[0]
    first.unlink()  # a part the tasks missed: the plain run makes it
    assert main(["dedup", "--data", str(data), "--out", str(out), "--no-progress"]) == 0
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "one"), "--no-progress"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["shards_reused"] == 2 and m["counts"] == {"exact": 2, "near": 1, "eval": 0}
    assert _dups(out) == _dups(tmp_path / "one")


def test_dedup_task_killed_mid_part_reruns_to_identical_output(tmp_path):
    data = _corpus(tmp_path)
    out = tmp_path / "killed"
    cmd = _cmd(DEDUP_SLOW, 1.0, ["dedup", "--data", str(data), "--out", str(out), "--num-tasks", "2",
                                 "--task-index", "0", "--no-progress"])
    kill_mid_part(cmd, ENV, out / "_parts")
    res = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "2 shard parts made, 1 reused" in res.stdout, res.stdout
    assert main(["dedup", "--data", str(data), "--out", str(out), "--no-progress"]) == 0
    assert json.loads((out / "manifest.json").read_text())["shards_reused"] == 3
    assert main(["dedup", "--data", str(data), "--out", str(tmp_path / "one"), "--no-progress"]) == 0
    assert _dups(out) == _dups(tmp_path / "one")
    assert _rows(out / "_parts") == _rows(tmp_path / "one" / "_parts")


def test_dedup_model_parts_in_decode_workers_equal_one_process(tmp_path):
    data = _corpus(tmp_path)
    spec = "clip:arch=halsift-tiny,pretrained=random,seed=1"
    common = ["--data", str(data), "--model", spec, "--cosine", "0.999", "--no-progress"]
    assert main(["dedup", *common, "--out", str(tmp_path / "w"), "--decode-workers", "2"]) == 0
    assert main(["dedup", *common, "--out", str(tmp_path / "one")]) == 0
    assert _dups(tmp_path / "w") == _dups(tmp_path / "one")
    assert json.loads((tmp_path / "w" / "manifest.json").read_text())["shards_reused"] == 0  # made by this run
    assert main(["dedup", *common, "--out", str(tmp_path / "w"), "--decode-workers", "2"]) == 0
    assert json.loads((tmp_path / "w" / "manifest.json").read_text())["shards_reused"] == 3  # the rerun reuses them
    w, one = (_rows(tmp_path / d / "embeddings") for d in ("w", "one"))
    assert [r["key"] for r in w] == [r["key"] for r in one]
    assert all(max(abs(a - b) for a, b in zip(x["embedding"], y["embedding"])) < 1e-3 for x, y in zip(w, one))


def test_embed_in_decode_workers_equals_one_process(tmp_path, capsys):
    """``embed --decode-workers 2`` makes two parts at a time in two processes: the rows of one process; on Ray
    (which makes --workers parts at a time) the flag is refused in one line naming it."""
    data = _corpus(tmp_path)
    common = ["embed", "--model", "clip:arch=halsift-tiny,pretrained=random,seed=1", "--data", str(data),
              "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "w"), "--decode-workers", "2"]) == 0
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    w, one = (_rows(tmp_path / d) for d in ("w", "one"))
    assert len(w) == len(one) > 0
    assert [(r["key"], r["sentence_index"]) for r in w] == [(r["key"], r["sentence_index"]) for r in one]
    assert all(max(abs(a - b) for a, b in zip(x["embedding"], y["embedding"])) < 1e-3 for x, y in zip(w, one))
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "r"), "--engine", "ray", "--decode-workers", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--decode-workers: halsift embed on --engine ray" in err and len(err.splitlines()) == 1, err


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("cmd,flags,expect", [
    ("basic", ["--decode-workers", "2"], "--decode-workers: halsift basic decodes no image"),
    ("basic", ["--address", "auto"], "--address/--workers: only with --engine ray"),
    ("dedup", ["--workers", "2"], "--address/--workers: only with --engine ray"),
    ("dedup", ["--engine", "tasks"], "--engine tasks: give --num-tasks"),
    ("basic", ["--engine", "ray", "--num-tasks", "2"], "--engine ray: Ray deals the parts itself"),
    ("dedup", ["--num-tasks", "2", "--task-index", "2"], "--task-index: expected 0 <= index < 2"),
])
def test_each_refused_flag_names_itself(tmp_path, capsys, cmd, flags, expect):
    data = _shards(tmp_path / "shards") if cmd == "basic" else _corpus(tmp_path)
    extra = FAST if cmd == "basic" else ["--no-progress"]
    assert main([cmd, "--data", str(data), "--out", str(tmp_path / "o"), *flags, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert expect in err and len(err.splitlines()) == 1, err


def test_engine_ray_without_ray_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed (import ray raises ImportError)
    for cmd, data, extra in (("basic", _shards(tmp_path / "shards"), FAST),
                             ("dedup", _corpus(tmp_path), ["--no-progress"])):
        assert main([cmd, "--data", str(data), "--out", str(tmp_path / cmd), "--engine", "ray", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "--engine ray: Ray is not installed" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "basic").exists()  # refused before the folder is made


def test_slurm_array_runs_basic_and_dedup_as_tasks():
    from halsift.launch.slurm_array import TASK_ID, task_command

    for cmd in ("basic", "dedup", "embed"):
        argv = task_command([cmd, "--data", "d", "--out", "o"], 4)
        assert argv[-4:] == ["--num-tasks", "4", "--task-index", TASK_ID]
    with pytest.raises(ValueError, match="drop --engine"):
        task_command(["dedup", "--data", "d", "--out", "o", "--engine", "ray"], 4)
    with pytest.raises(ValueError, match="not 'train'"):
        task_command(["train", "--out", "o"], 4)
