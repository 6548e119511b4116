"""`halsift score --wandb` / `halsift select --wandb` (WANDB_MODE=offline): one offline run beside the output holding
throughput, skipped counts and the kept fraction; without the flag, no run."""

from __future__ import annotations

import json
import time

import pytest
from filtering_data import make_corpus

from halsift.corpus.scores import read_scores_df
from halsift.corpus.shards import iter_samples
from halsift.filtering.scoring.parts import part_stats
from halsift.launch.cli import main
from halsift.launch.run_wandb import log_recipe_stage, select_metrics

pytest.importorskip("wandb")


def _records(path) -> list:
    """The protobuf records of a ``.wandb`` file (LevelDB log blocks of 32 KiB after a 7-byte ``:W&B`` header)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        buf, pos = buf + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last fragment of one
            out.append(pb.Record.FromString(buf))
            buf = b""
    return out


def _logged(folder, *keys: str) -> tuple[list[dict], dict]:
    """(history rows, final summary) of the one offline run in ``folder``, once the summary holds ``keys``
    (wandb's service may flush the file just after finish())."""
    import json

    runs = list((folder / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, runs
    deadline = time.monotonic() + 20
    while True:
        history, summary = [], {}
        for r in _records(runs[0]):
            kind = r.WhichOneof("record_type")
            if kind in ("history", "summary"):
                items = r.history.item if kind == "history" else r.summary.update
                got = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                (history.append(got) if kind == "history" else summary.update(got))
        if all(k in summary for k in keys) or time.monotonic() > deadline:
            return history, summary
        time.sleep(0.2)


def _kept(scores, labels: dict, n: int) -> tuple[set, float]:
    """(output sample keys ``<key>_s<idx>``, precision) of the ``n`` best-scored sentences."""
    top = scores.sort_values("score", ascending=False).head(n)
    got = [labels[(k, i)] for k, i in zip(top["key"], top["sentence_index"])]
    keys = {f"{k}_s{i}" for k, i in zip(top["key"], top["sentence_index"])}
    return keys, round(100 * got.count("correct") / (got.count("correct") + got.count("incorrect")), 4)  # 0-100


def test_score_and_select_log_offline_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    corpus = make_corpus(tmp_path / "c", shards=2, per_shard=4, seed=1)
    assert main(["score", "--detector", "random:seed=0", "--data", str(corpus), "--out", str(tmp_path / "s"),
                 "--no-progress", "--wandb"]) == 0
    samples = list(iter_samples(corpus))
    per_shard = [sum(len(x.meta["sentences"]) for x in samples if x.shard == t.name)
                 for t in sorted(corpus.glob("*.tar"))]
    n = sum(per_shard)
    labels = {(x.key, st["position"]): st["label"] for x in samples for st in x.meta["sentences"]}
    manifest = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    history, summary = _logged(tmp_path / "s", "items", "items_per_s", "skipped", "parse_failures")
    assert {k: summary[k] for k in ("items", "samples", "parts", "parts_resumed", "items_scored_this_run",
                                    "parse_failures", "skipped")} == {
        "items": n, "samples": 8, "parts": 2, "parts_resumed": 0, "items_scored_this_run": n,
        "parse_failures": 0, "skipped": 0}
    assert (summary["items_per_s"], summary["wall_time_s"]) == (manifest["sentences_per_s"], manifest["wall_time_s"])
    assert [h["part/items"] for h in history] == per_shard and [h["part/samples"] for h in history] == [4, 4]
    assert [(h["part/parse_failures"], h["part/skipped"]) for h in history] == [(0, 0), (0, 0)]
    for h, name in zip(history, manifest["part_files"]):
        st = part_stats(tmp_path / "s" / name)
        assert h["part/items_per_s"] == pytest.approx(st["sentences"] / (st["time_model_s"] + st["time_data_s"]),
                                                      abs=0.01)
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(corpus), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--no-progress", "--wandb"]) == 0
    kept = int(n * 0.5 + 0.5)  # keep=0.5 of n sentences, rounded half up
    keys, precision = _kept(read_scores_df(tmp_path / "s"), labels, kept)
    correct = sum(v == "correct" for v in labels.values())
    want = {"candidates": n, "kept_units": kept, "kept_fraction": round(kept / n, 6), "samples_written": kept,
            "skipped": 0, "corrupt_shards": 0, "precision/kept": precision,
            "precision/input": round(100 * correct / sum(v in ("correct", "incorrect") for v in labels.values()), 4)}
    _, summary = _logged(tmp_path / "sel", *want, "candidates_per_s")
    assert {k: summary[k] for k in want} == want
    assert summary["candidates_per_s"] == pytest.approx(n / summary["wall_time_s"], rel=0.01, abs=0.1)
    assert {x.key for x in iter_samples(tmp_path / "sel")} == keys  # one sample per kept sentence
    assert "wandb (offline): " in capsys.readouterr().out
    # the resumable select logs the same figures; a select without --wandb does not log
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(corpus), "--out", str(tmp_path / "res"),
                 "--keep", "0.5", "--no-progress", "--resumable", "--wandb"]) == 0
    _, summary = _logged(tmp_path / "res", *want)
    assert {k: summary[k] for k in want} == want
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(corpus), "--out", str(tmp_path / "no"),
                 "--keep", "0.5", "--no-progress"]) == 0
    assert not (tmp_path / "no" / "wandb").exists()
    # a recipe's stage: one run, each filter's figures under its name
    log_recipe_stage("select", tmp_path / "stage", {"mem": tmp_path / "sel", "res": tmp_path / "res"}, "offline",
                     "halsift", "tiny")
    _, summary = _logged(tmp_path / "stage", "mem/kept_fraction", "res/kept_fraction")
    assert summary["mem/kept_fraction"] == summary["res/kept_fraction"] == want["kept_fraction"]
    assert summary["mem/samples_written"] == summary["res/samples_written"] == kept

def test_select_metrics_read_both_manifests():
    common = {"candidates": 40, "kept_units": 10, "samples_written": 9, "wall_time_s": 2.0,
              "precision": {"input": 0.5, "kept": 0.8}, "corrupt_shards": ["a.tar: bad"]}
    mem = select_metrics({**common, "skipped": {"total": 1}})
    res = select_metrics({**common, "skipped_samples": {"count": 1}})
    assert mem == res
    assert mem["kept_fraction"] == 0.25 and mem["skipped"] == 1 and mem["corrupt_shards"] == 1
    assert mem["candidates_per_s"] == 20.0 and mem["precision/kept"] == 80.0  # no "scale": shares, read as %
    assert mem["sentence_precision/kept"] is None  # a manifest from before the field
    whole = select_metrics({**common, "skipped": {"total": 1}, "sentence_precision": {"input": 0.6, "kept": 0.9}})
    assert (whole["sentence_precision/input"], whole["sentence_precision/kept"]) == (60.0, 90.0)
