"""Regression tests from the reliability probes (issues 19 and 35), by stage: `train clip` / `train detector` under bad
input: skipped samples, unfinished selections, no silent overwrite."""

from __future__ import annotations

import json

from cli_cases import _err_line, _select, scored
from filtering_data import make_bench, make_corpus

from halsift.launch.cli import main


def test_train_detector_skips_a_missing_bench_image(tmp_path):
    from halsift.corpus.bench import read_bench, write_bench

    bench = make_bench(tmp_path / "b", captions=8, seed=1)
    rows = [r.to_json() for r in read_bench(bench)]
    for r in rows:
        r["split"] = "train"
    write_bench(bench, rows)
    (tmp_path / "b" / "images" / "im0.png").unlink()
    lost = sum(r["image"] == "images/im0.png" and r["label"] != "unknown" for r in rows)
    out = tmp_path / "det"
    assert main(["train", "detector", "--base", "clip:arch=halsift-tiny,pretrained=random,seed=1", "--bench",
                 str(bench), "--out", str(out), "--steps", "1", "--batch-size", "4", "--val-split", "", "--wandb-mode",
                 "disabled"]) == 0
    info = json.loads((out / "run_info.json").read_text())
    assert info["skipped"]["by_kind"] == {"missing_image": lost} and lost >= 1
    assert info["train_rows"] == sum(r["label"] != "unknown" for r in rows) - lost
    assert (out / "adapter" / "detector.yaml").exists()


def test_train_clip_refuses_an_unfinished_selection(scored, tmp_path, capsys):
    data, rand = scored
    assert _select(rand, data, tmp_path / "sel") == 0
    m = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    (tmp_path / "sel" / "manifest.json").write_text(json.dumps({**m, "status": "running"}))  # a killed select
    capsys.readouterr()
    args = ["train", "clip", "--data", str(tmp_path / "sel"), "--out", str(tmp_path / "run"), "--model",
            "halsift-tiny", "--steps", "1", "--batch-size", "2", "--workers", "0", "--wandb-mode", "disabled"]
    assert main(args) == 2
    line = _err_line(capsys)
    assert str(tmp_path / "sel") in line and "'running'" in line
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_train_clip_without_resume_refuses_to_overwrite_checkpoints(tmp_path, capsys):
    data = make_corpus(tmp_path / "c", shards=1, per_shard=4)
    out = tmp_path / "run"
    ckpt = out / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights")
    (ckpt / "state.json").write_text('{"step": 2}')
    args = ["train", "clip", "--data", str(data), "--out", str(out), "--model", "halsift-tiny", "--steps", "1",
            "--batch-size", "2", "--workers", "0", "--wandb-mode", "disabled"]
    assert main(args) == 2
    line = _err_line(capsys)
    assert "--resume" in line and str(out) in line
    assert (ckpt / "model.safetensors").read_bytes() == b"weights" and not (out / "config.json").exists()


def test_train_clip_on_shards_without_a_readable_sample_fails_fast(tmp_path, capsys):
    import time

    keys = {f"s0_{i:05d}": "image" for i in range(4)}
    data = make_corpus(tmp_path / "c", shards=1, per_shard=4, corrupt=keys)
    t0 = time.perf_counter()
    assert main(["train", "clip", "--data", str(data), "--out", str(tmp_path / "run"), "--model", "halsift-tiny",
                 "--steps", "2", "--batch-size", "2", "--workers", "0", "--wandb-mode", "disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # (after the progress bar's lines)
    line = err[-1]
    assert line.startswith("halsift train clip: error: data") and "Traceback" not in "\n".join(err)
    assert "no readable sample" in line and str(data) in line and time.perf_counter() - t0 < 60
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_train_detector_on_an_empty_split_is_one_line(tmp_path, capsys):
    bench = make_bench(tmp_path / "b", captions=4)  # every row is split "test"
    assert main(["train", "detector", "--base", "clip:arch=halsift-tiny,pretrained=random,seed=1", "--bench",
                 str(bench), "--out", str(tmp_path / "det"), "--steps", "1", "--wandb-mode", "disabled"]) == 2
    line = _err_line(capsys)
    assert "split 'train'" in line and str(bench) in line
