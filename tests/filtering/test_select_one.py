"""Issue 30's one select: both engines (in memory, --resumable) keep one output-folder state, so a select killed
anywhere reruns to the identical result and a complete one is returned as it is; one folder check; every flag in
--describe; the recipe's select section uses the command's names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from filtering_data import scored_corpus

from halsift.launch.cli import main

ENV = {**os.environ, "HALSIFT_QUIET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
# a select that SIGKILLs itself at its KILL_AT-th output sample, whichever engine writes it
KILLED = """
import os, signal, sys
from halsift.corpus import shards
write, n = shards.ShardWriter.write, [0]
def killing_write(self, sample):
    n[0] += 1
    if n[0] == int(os.environ["KILL_AT"]):
        os.kill(os.getpid(), signal.SIGKILL)
    write(self, sample)
shards.ShardWriter.write = killing_write
from halsift.launch.cli import main
sys.exit(main(sys.argv[1:]))
"""
ENGINES = {"memory": ["--maxcount", "3", "--html"], "resumable": ["--resumable"]}


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    return scored_corpus(tmp_path_factory.mktemp("one"), shards=3, per_shard=6, seed=6)


def _args(scored, out: Path, *extra) -> list[str]:
    corpus, scores = scored
    return ["select", "--scores", str(scores), "--data", str(corpus), "--out", str(out), "--threshold", "30",
            "--no-progress", *extra]


def _tree(out: Path) -> dict:
    """Every file under ``out`` (bytes), the manifest without its wall time."""
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    m = json.loads(files.pop("manifest.json"))
    m.pop("wall_time_s")
    return {**files, "manifest.json": m}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_killed_select_reruns_to_the_identical_result(scored, tmp_path, engine, capsys):
    killed, clean = tmp_path / "killed" / "sel", tmp_path / "clean" / "sel"
    keys = {d: d.parent / "keys.txt" for d in (killed, clean)}
    res = subprocess.run([sys.executable, "-c", KILLED, *_args(scored, killed, *ENGINES[engine], "--export-keys",
                                                               str(keys[killed]))],
                         env={**ENV, "KILL_AT": "15"}, capture_output=True, text=True, timeout=120)
    assert res.returncode == -9, res.stderr[-2000:]
    assert json.loads((killed / "manifest.json").read_text())["status"] == "running"
    assert list(killed.glob("*.tar")), "killed after its first output shard"
    assert main(_args(scored, killed, *ENGINES[engine], "--export-keys", str(keys[killed]))) == 0
    assert main(_args(scored, clean, *ENGINES[engine], "--export-keys", str(keys[clean]))) == 0
    assert _tree(killed) == _tree(clean)
    assert keys[killed].read_text() == keys[clean].read_text() != ""


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_complete_selection_rerun_is_returned_as_it_is(scored, tmp_path, engine, capsys):
    out = tmp_path / "sel"
    assert main(_args(scored, out, *ENGINES[engine])) == 0
    first, manifest = capsys.readouterr().out, (out / "manifest.json").read_bytes()
    assert main(_args(scored, out, *ENGINES[engine])) == 0
    assert (out / "manifest.json").read_bytes() == manifest
    assert capsys.readouterr().out.splitlines()[0] == first.splitlines()[0]  # the same summary


@pytest.mark.parametrize("change, key", [(["--threshold", "40"], "threshold"), (["--captioner", "other"],
                                                                                "meta_defaults")])
def test_one_folder_check_refuses_another_selection_the_same_way_in_both_engines(scored, tmp_path, change, key,
                                                                                 capsys):
    lines = {}
    for engine, extra in ENGINES.items():
        out = tmp_path / engine
        assert main(_args(scored, out, *extra)) == 0
        capsys.readouterr()
        args = _args(scored, out, *extra)
        if change[0] == "--threshold":
            args[args.index("--threshold") + 1] = change[1]
        else:
            args += change
        assert main(args) == 2
        lines[engine] = re.sub(r"out: \S+ ", "out: OUT ", capsys.readouterr().err.strip())
        assert len(lines[engine].splitlines()) == 1
        assert f"holds a selection with a different {key}" in lines[engine]
    assert lines["memory"] == lines["resumable"]


def test_the_other_engine_does_not_continue_a_selection(scored, tmp_path, capsys):
    out = tmp_path / "sel"
    assert main(_args(scored, out, *ENGINES["memory"])) == 0
    capsys.readouterr()
    assert main(_args(scored, out, "--resumable")) == 2
    assert "holds a selection with a different engine ('memory' vs 'resumable')" in capsys.readouterr().err


def test_describe_and_the_reference_list_every_select_flag(capsys):
    with pytest.raises(SystemExit, match="^0$"):
        main(["select", "--help"])
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", capsys.readouterr().out)) - {"--help", "--describe"}
    with pytest.raises(SystemExit, match="^0$"):
        main(["select", "--describe"])
    described = {line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line and line[0] != "#"}
    names = {f[2:].replace("-", "_") for f in flags if not (f.startswith("--no-") and f[5:].replace("-", "_")
                                                              in described)}
    assert names <= described, sorted(names - described)
    assert {"resumable", "keys_only", "memory_limit", "num_tasks", "task_index", "wandb", "wandb_project"} <= described
    doc = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    section = doc.split("### `halsift select`")[1].split("\n### ")[0]
    assert all(f"| `{n}` |" in section for n in names), sorted(n for n in names if f"| `{n}` |" not in section)


def test_the_recipe_select_section_uses_the_command_names(tmp_path, monkeypatch, capsys):
    assert main(["run", "quickstart", "select.default_captioner=x", "--dry-run"]) == 2
    assert "select.default_captioner: renamed to 'select.captioner'" in capsys.readouterr().err
    from halsift.corpus.config import from_dict
    from halsift.filtering.selection import select as select_mod
    from halsift.launch.stages import resolve_paths
    from halsift.launch.stages.select import stage_select
    from halsift.launch.recipe_config import Recipe

    r = from_dict(Recipe, {"run_dir": str(tmp_path), "score": {"detectors": {"r": "random:seed=0"}},
                           "select": {"captioner": "cap9", "source": "t2i"}, "wandb": {"mode": "disabled"}})
    seen = {}

    class Reached(Exception):
        pass

    def record(*a, **kw):
        seen.update(kw)
        raise Reached

    monkeypatch.setattr(select_mod, "select", record)
    with pytest.raises(Reached, match="^$"):  # the stage reaches the command's select with the section's values
        stage_select(r, resolve_paths(r))
    assert seen["meta_defaults"] == {"captioner": "cap9", "source": "t2i"}
