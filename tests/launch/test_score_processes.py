"""The score stage scores its detectors, and each member of a set-level ensemble, at once in single-threaded
processes (``score.jobs``, issue 52): the same scores as one after another (to rounding), the same selections, a
folder made one way reused by the other, and a set-level ensemble whose member changed emptied once and scored
again while the other detectors' folders stay as they are."""

from __future__ import annotations

import json

import numpy as np
import pytest
from file_ids import file_ids

from halsift.corpus.scores import read_scores_df
from halsift.launch.cli import main

BASE = ["world.images=40", "world.bench_images=10", "world.pretrain_images=40", "world.retrieval_images=12",
        "world.leaks=0", "world.exact_copies=0", "pretrain.steps=3", "pretrain.batch_size=16", "score.batch_size=32",
        "wandb.mode=disabled"]
ZSCORED = "ensemble:members=[clip:arch={arch},checkpoint={base};clip:arch={arch},pretrained=random,seed=%d],norm=zscore"
DETECTORS = {"clip": "clip:arch={arch},checkpoint={base}", "other": "clip:arch={arch},pretrained=random,seed=3",
             "z": ZSCORED % 1, "random": "random:seed=0"}
FOLDERS = [f"{d}/{w}" for d in ("clip", "other", "z", "random") for w in ("corpus", "bench")]


def _recipe(tmp_path, detectors: dict) -> str:
    """The quickstart up to select, with untrained detectors: two CLIPs, a z-scored ensemble of two, random."""
    import yaml

    from halsift.launch.cmd_run import shipped_recipes

    r = yaml.safe_load(shipped_recipes()["quickstart"].read_text())
    for key in ("detectors", "evals"):
        r.pop(key)
    r["score"] = {"detectors": detectors}
    r["select"].pop("variants", None)
    r["stages"] = ["world", "pretrain", "dedup", "score", "select"]
    path = tmp_path / f"recipe-{len(list(tmp_path.glob('recipe-*')))}.yaml"
    path.write_text(yaml.safe_dump(r))
    return str(path)


def _scores(run) -> dict:
    return {f: read_scores_df(run / "score" / f).sort_values(["key", "sentence_index"]).reset_index(drop=True)
            for f in FOLDERS}


def _manifest(folder) -> dict:
    return json.loads((folder / "_manifest.json").read_text())


@pytest.fixture(scope="module")
def at_once(tmp_path_factory):
    """A run whose score stage ran two processes at a time, and what it printed."""
    tmp = tmp_path_factory.mktemp("at_once")
    run = tmp / "run"
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", _recipe(tmp, DETECTORS), f"run_dir={run}", *BASE, "score.jobs=2"]) == 0
    return tmp, run, out.getvalue()


def test_detectors_and_members_score_at_once_as_they_would_one_after_another(at_once, tmp_path):
    tmp, run, out = at_once
    assert "score: 4 detectors and ensemble members, 2 at a time (one thread each)" in out
    for label in ("clip", "other", "z (member 0)", "z (member 1)"):
        assert f"score: {label} done (" in out, out[-3000:]
    assert "random done" not in out  # costs nothing: left to the stage's own pass
    for what in ("corpus", "bench"):
        for i in (0, 1):  # each member scored in its own single-threaded process
            member = _manifest(run / "score" / "z" / what / "_members" / str(i))
            assert member["torch_threads"]["threads"] == 1 and member["sentences_scored_this_run"] > 0
        assert _manifest(run / "score" / "z" / what)["status"] == "complete"

    serial = tmp_path / "serial"
    assert main(["run", _recipe(tmp_path, DETECTORS), f"run_dir={serial}", *BASE, "score.jobs=1"]) == 0
    a, b = _scores(run), _scores(serial)
    for folder in FOLDERS:
        assert list(a[folder]["key"]) == list(b[folder]["key"]), folder
        np.testing.assert_allclose(a[folder]["score"], b[folder]["score"], atol=1e-3, err_msg=folder)
    import pandas as pd

    for det in ("clip", "other", "z", "random"):  # the same captions kept
        kept = [set(pd.read_parquet(r / "select" / det / "kept.parquet")["key"]) for r in (run, serial)]
        assert kept[0] == kept[1] and kept[0], det


def test_a_changed_member_rescores_its_ensemble_alone_and_a_rerun_reuses_every_folder(at_once, capsys):
    tmp, run, _ = at_once
    kept = [f for f in FOLDERS if not f.startswith("z/")] + [f"z/{w}/_members/{i}" for w in ("corpus", "bench")
                                                             for i in (0, 1)]
    before, scores = {f: file_ids(run / "score" / f) for f in kept}, _scores(run)
    # the stage again (its record removed): every folder found done, in the processes and in the stage's own pass
    # (a set-level ensemble's combination, cheap, is written again from its members' parts: the same scores)
    (run / "score" / "_done.json").unlink()
    assert main(["run", _recipe(tmp, DETECTORS), f"run_dir={run}", *BASE, "score.jobs=2"]) == 0
    assert {f: file_ids(run / "score" / f) for f in kept} == before
    for f in kept:
        assert _manifest(run / "score" / f).get("sentences_scored_this_run", 0) == 0, f
    for f, df in _scores(run).items():
        assert df.equals(scores[f]), f

    # the ensemble's second member changes: its folders are emptied once (before the processes start) and scored
    # again; the other detectors' are reused as they are
    capsys.readouterr()
    assert main(["run", _recipe(tmp, {**DETECTORS, "z": ZSCORED % 2}), f"run_dir={run}", *BASE,
                 "score.jobs=2"]) == 0
    out = capsys.readouterr().out
    emptied = sorted(line.split(":")[0].replace("[halsift run] ", "") for line in out.splitlines()
                     if "emptying it and scoring again" in line)
    assert emptied == sorted(str(d) for d in (run / "score" / "z").iterdir()), out[-3000:]  # corpus, bench, calibration
    assert len(emptied) >= 2
    for f in FOLDERS:
        if f.startswith("z/"):
            assert "seed=2" in _manifest(run / "score" / f)["detector"]
            for i in (0, 1):  # both scored again, in the processes (the stage's pass did not empty them after)
                member = _manifest(run / "score" / f / "_members" / str(i))
                assert member["sentences_scored_this_run"] > 0 and member["torch_threads"]["threads"] == 1, (f, i)
        else:
            assert file_ids(run / "score" / f) == before[f], f
