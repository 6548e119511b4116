"""`select --resumable`: the same selection as the in-memory select, a key list without shards, N tasks sharing
the resharding, and a select SIGKILLed mid-way that reruns to byte-identical output."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from filtering_data import make_corpus, scored_corpus

from halsift.corpus.shards import iter_samples
from halsift.filtering.scoring.runner import score
from halsift.filtering.selection.select import select
from halsift.filtering.selection.resumable import STATE, select_resumable
from halsift.launch.cli import main

ENV = {**os.environ, "HALSIFT_QUIET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
SAME = ("kept_units", "samples_written", "source_samples_kept", "kept_units_per_captioner", "precision",
        "labelled_units", "keys", "score_rows", "candidates", "selected", "threshold_used")


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    return scored_corpus(tmp_path_factory.mktemp("sel"), shards=5, per_shard=6, seed=3)


def _samples(folder) -> dict:
    return {s.key: (s.caption, json.dumps(s.meta, sort_keys=True), s.image) for s in iter_samples(folder)}


def _same_table(a: Path, b: Path) -> None:
    """Equal names, types and values (DuckDB marks its columns NOT NULL; pyarrow's are nullable)."""
    ta, tb = pq.read_table(a), pq.read_table(b)
    assert [(f.name, f.type) for f in ta.schema] == [(f.name, f.type) for f in tb.schema]
    assert ta.to_pydict() == tb.to_pydict()


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and p.name != "manifest.json"}


@pytest.mark.parametrize("how", [dict(keep=0.3), dict(keep=0.4, unit="caption", agg="min"),
                                 dict(top_k=25, unit="caption", agg="prune")])
def test_same_selection_as_in_memory_select(scored, tmp_path, how):
    corpus, scores = scored
    ref = select(scores, corpus, tmp_path / "ref", show_progress=False, **how)
    run = select_resumable(scores, corpus, tmp_path / "res", **how)
    m = run["manifest"]
    assert m["status"] == "complete" and run["shards_written"] == 5
    assert {k: m[k] for k in SAME} == {k: ref[k] for k in SAME}
    assert _samples(tmp_path / "res") == _samples(tmp_path / "ref") and m["samples_written"] > 0
    _same_table(tmp_path / "res" / "kept.parquet", tmp_path / "ref" / "kept.parquet")
    sizes = json.loads((tmp_path / "res" / "sizes.json").read_text())
    assert sum(sizes.values()) == m["samples_written"] and set(sizes) <= {f"{i:06d}.tar" for i in range(5)}


def test_tasks_in_turn_equal_one_process_and_keys_only(scored, tmp_path):
    corpus, scores = scored
    one = select_resumable(scores, corpus, tmp_path / "one", keep=0.3)["manifest"]
    first = select_resumable(scores, corpus, tmp_path / "two", keep=0.3, num_tasks=2, task_index=0)
    # task 0 steals whatever no one holds: alone, it writes every shard
    assert first["shards_written"] == 5 and first["manifest"]["status"] == "complete"
    again = select_resumable(scores, corpus, tmp_path / "two", keep=0.3, num_tasks=2, task_index=1)
    assert again["shards_written"] == 0 and again["shards_done_before"] == 5
    assert _digest(tmp_path / "one") == _digest(tmp_path / "two")
    assert {k: again["manifest"][k] for k in SAME} == {k: one[k] for k in SAME}
    assert main(["select", "--scores", str(scores), "--data", str(corpus), "--out", str(tmp_path / "k"), "--keep",
                 "0.3", "--keys-only"]) == 0
    assert not list((tmp_path / "k").glob("*.tar"))
    _same_table(tmp_path / "k" / "kept.parquet", tmp_path / "one" / "kept.parquet")
    m = json.loads((tmp_path / "k" / "manifest.json").read_text())
    assert m["status"] == "complete" and m["kept_units"] == one["kept_units"] and m["filter"]["keys_only"]


def test_killed_select_reruns_to_identical_output(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", shards=60, per_shard=8, seed=4)
    score("random:seed=2", corpus, tmp_path / "scores", batch_size=64, show_progress=False)
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "halsift.launch.cli", "select", "--scores", str(tmp_path / "scores"), "--data",
           str(corpus), "--out", str(out), "--keep", "0.5", "--resumable", "--no-progress"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marks = out / STATE / "shards"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and len(list(marks.glob("*.json")) if marks.exists()
                                                                  else []) < 3:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list(marks.glob("*.json")))
    assert 3 <= done < 60, "the select should have been killed part-way"
    assert json.loads((out / "manifest.json").read_text())["status"] == "running"
    res = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "kept " in res.stdout
    clean = select_resumable(tmp_path / "scores", corpus, tmp_path / "clean", keep=0.5)
    assert _digest(out) == _digest(tmp_path / "clean")
    m = json.loads((out / "manifest.json").read_text())
    assert {k: m[k] for k in SAME} == {k: clean["manifest"][k] for k in SAME}
    assert not list(out.glob(".*.work"))


def test_resumable_errors_exit_2(scored, tmp_path, capsys):
    corpus, scores = scored
    base = ["select", "--scores", str(scores), "--data", str(corpus), "--out", str(tmp_path / "o")]
    assert main([*base, "--keep", "0.3", "--resumable"]) == 0
    capsys.readouterr()
    assert main([*base, "--keep", "0.5", "--resumable"]) == 2
    assert "holds a selection with a different keep (0.3 vs 0.5)" in capsys.readouterr().err
    assert main([*base[:-1], str(tmp_path / "p"), "--keep", "0.3", "--per-captioner", "--resumable"]) == 2
    assert "--resumable: not with --per-captioner" in capsys.readouterr().err
    assert main([*base[:-1], str(tmp_path / "q"), "--keep", "0.3", "--unit", "caption", "--agg", "mean",
                 "--keys-only"]) == 2
    assert "not for caption agg=mean" in capsys.readouterr().err
    running = tmp_path / "running"
    running.mkdir()
    (running / "_manifest.json").write_text(json.dumps({"status": "running"}))
    assert main(["select", "--scores", str(running), "--data", str(corpus), "--out", str(tmp_path / "r"), "--keep",
                 "0.3", "--resumable"]) == 2
    assert "_manifest.json: the score manifest says status 'running'" in capsys.readouterr().err


def test_pipeline_select_step_reuses_complete_resumes_killed_and_names_another_selection(scored, tmp_path):
    """What a recipe's select stage relies on: the same selection complete is returned untouched (no shard
    rewritten), one killed before its manifest is made again to the same bytes, and a folder of another selection
    is refused as a :class:`SelectionMismatch` (the recipe then empties that one folder)."""
    from halsift.filtering.selection.score_folder import SelectionMismatch

    corpus, scores = scored
    dest = tmp_path / "sel"
    args = dict(keep=0.3, unit="sentence", agg="min", per_captioner=False, seed=0)
    ref = select(scores, corpus, dest, show_progress=False, **args)
    stamps = {f.name: f.stat().st_mtime_ns for f in dest.glob("*.tar")}
    assert select(scores, corpus, dest, show_progress=False, **args) == ref  # complete: as it is
    assert {f.name: f.stat().st_mtime_ns for f in dest.glob("*.tar")} == stamps
    digest = _digest(dest)
    (dest / "manifest.json").unlink()  # what a select killed before its manifest leaves: shards, no manifest
    select(scores, corpus, dest, show_progress=False, **args)  # the rerun succeeds, identically
    assert _digest(dest) == digest
    with pytest.raises(SelectionMismatch, match="holds a selection with a different keep"):
        select(scores, corpus, dest, show_progress=False, **{**args, "keep": 0.5})


def test_two_concurrent_select_tasks_equal_one(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", shards=30, per_shard=6, seed=5)
    score("random:seed=4", corpus, tmp_path / "scores", batch_size=64, show_progress=False)
    out = tmp_path / "two"
    cmds = [[sys.executable, "-m", "halsift.launch.cli", "select", "--scores", str(tmp_path / "scores"), "--data",
             str(corpus), "--out", str(out), "--keep", "0.4", "--num-tasks", "2", "--task-index", str(i),
             "--no-progress"] for i in range(2)]
    procs = [subprocess.Popen(c, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert any("kept " in o for o, _ in outs)  # whoever finished last wrote the manifest
    one = select_resumable(tmp_path / "scores", corpus, tmp_path / "one", keep=0.4)
    assert _digest(out) == _digest(tmp_path / "one")
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "complete" and {k: m[k] for k in SAME} == {k: one["manifest"][k] for k in SAME}


def test_a_task_that_loses_the_race_to_start_the_folder_reads_the_winners_filter(tmp_path, monkeypatch):
    # two tasks start one selection at once: the one whose _select lands second takes the other's (the same
    # selection: it goes on; another selection: refused by name), never "already holds shards" for a folder that a
    # running task of the same selection is starting
    import halsift.filtering.selection.guard as guard
    from halsift.filtering.selection.score_folder import SelectionMismatch

    real = os.rename

    def other_task_first(filt):
        def rename(src, dst):
            if Path(dst).name == guard.STATE and not Path(dst).exists():
                Path(dst).mkdir()
                (Path(dst) / guard.FILTER).write_text(json.dumps(filt))
            return real(src, dst)
        return rename

    filt = {"scores": "s", "data": ["d"], "keep": 0.4}
    monkeypatch.setattr(guard.os, "rename", other_task_first(filt))
    assert guard.open_selection(tmp_path / "same", filt) is None
    assert json.loads((tmp_path / "same" / guard.STATE / guard.FILTER).read_text()) == filt
    assert not list((tmp_path / "same").glob(f".{guard.STATE}-*"))  # the loser's staging folder is gone
    monkeypatch.setattr(guard.os, "rename", other_task_first({**filt, "keep": 0.2}))
    with pytest.raises(SelectionMismatch, match="keep"):
        guard.open_selection(tmp_path / "other", filt)
