"""Issue 35: the last tracebacks become one line naming the file (exit 2): a float64 ``score`` column in a part
(read as float32 now; a string column refused), a pickle given as weights (refused, never unpickled), a full disk
(the error names the file being written)."""

from __future__ import annotations

import errno
import json
import pickle
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from filtering_data import make_bench, make_corpus, restamp

from halsift.corpus.scores import read_scores_df
from halsift.launch.cli import main


def _err_line(capsys) -> str:
    """The last stderr line of a failed command, asserting that no traceback came before it."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err[-3000:]
    return err.splitlines()[-1]


def _score(data, out, detector="random:seed=1", *extra) -> int:
    return main(["score", "--detector", detector, "--data", str(data), "--out", str(out), "--no-progress", *extra])


def _select(scores, data, out, *extra) -> int:
    return main(["select", "--scores", str(scores), "--data", str(data), "--out", str(out), "--keep", "0.5",
                 "--no-progress", *extra])


def _retype(part: Path, column: str, values) -> None:
    t = pq.read_table(part)
    pq.write_table(t.set_column(t.schema.get_field_index(column), column, values), part)
    restamp(part.parent)  # an edit on purpose: recorded, so that select reads the part instead of refusing it


@pytest.fixture()
def scored(tmp_path):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=5, seed=3)
    assert _score(data, tmp_path / "rand") == 0
    return data, tmp_path / "rand"


# ------------------------------------------------------------------------------------ (a) the score column's type
@pytest.mark.parametrize("path", ["in-memory", "resumable"])
@pytest.mark.parametrize("dtype", [pa.float64(), pa.int64()])
def test_a_numeric_score_column_of_another_type_is_read_as_float32(scored, tmp_path, path, dtype):
    """One part's score column written as float64 (pandas' default) or int64, the other part float32: the same
    selection as from the folder before, in both select paths (before: a traceback, exit 1)."""
    data, rand = scored
    extra = ["--resumable"] if path == "resumable" else []
    parts = sorted(rand.glob("part-*.parquet"))
    if pa.types.is_integer(dtype):  # whole-number scores, so that the int64 part holds the same numbers
        for part in parts:
            _retype(part, "score", pa.array([float(round(v)) for v in pq.read_table(part)["score"].to_pylist()],
                                            pa.float32()))
    assert _select(rand, data, tmp_path / "want", *extra) == 0
    _retype(parts[1], "score", pq.read_table(parts[1])["score"].cast(dtype))
    assert _select(rand, data, tmp_path / "got", *extra) == 0
    key = ["key", "sentence_index"]
    want = pq.read_table(tmp_path / "want" / "kept.parquet").to_pandas().sort_values(key).reset_index(drop=True)
    got = pq.read_table(tmp_path / "got" / "kept.parquet").to_pandas().sort_values(key).reset_index(drop=True)
    assert len(got) and got[key].equals(want[key])
    assert read_scores_df(rand)["score"].dtype == "float32"


def test_eval_bench_reads_float64_score_parts(tmp_path):
    from halsift.filtering.scoring.runner import score_bench

    bench = make_bench(tmp_path / "b", captions=6)
    scores = tmp_path / "scores"
    score_bench("random:seed=1", bench, scores, show_progress=False)
    args = ["eval", "bench", "--bench", str(bench), "--scores", str(scores), "--n-boot", "10", "--no-plots",
            "--no-html"]
    assert main([*args, "--out", str(tmp_path / "ev1")]) == 0
    (part,) = scores.glob("part-*.parquet")  # split in two: its second half with a float64 score column
    t = pq.read_table(part)
    half = len(t) // 2
    pq.write_table(t.slice(0, half), part)
    second = t.slice(half)
    pq.write_table(second.set_column(second.schema.get_field_index("score"), "score",
                                     second["score"].cast(pa.float64())), scores / "part-bench-00001.parquet")
    assert main([*args, "--out", str(tmp_path / "ev2")]) == 0
    a = json.loads((tmp_path / "ev1" / "metrics.json").read_text())
    b = json.loads((tmp_path / "ev2" / "metrics.json").read_text())
    aurocs = [k for k in a if "auroc/" in k]
    assert aurocs and {k: b[k] for k in aurocs} == {k: a[k] for k in aurocs}


@pytest.mark.parametrize("path", ["in-memory", "resumable"])
def test_a_string_score_column_is_one_line_naming_the_part(scored, tmp_path, capsys, path):
    data, rand = scored
    part = rand / "part-000001.parquet"
    _retype(part, "score", pq.read_table(part)["score"].cast(pa.string()))
    capsys.readouterr()
    assert _select(rand, data, tmp_path / "sel", *(["--resumable"] if path == "resumable" else [])) == 2
    line = _err_line(capsys)
    assert str(part) in line and "'score'" in line and "string" in line and "numbers" in line
    assert not (tmp_path / "sel" / "kept.parquet").exists()


def test_a_sentence_index_beyond_int32_is_one_line(scored, tmp_path, capsys):
    data, rand = scored
    part = rand / "part-000001.parquet"
    n = pq.read_metadata(part).num_rows
    _retype(part, "sentence_index", pa.array([2**40] * n, pa.int64()))
    capsys.readouterr()
    assert main(["eval", "bench", "--bench", str(make_bench(tmp_path / "b", captions=3)), "--scores", str(rand),
                 "--out", str(tmp_path / "ev")]) == 2
    line = _err_line(capsys)
    assert str(part) in line and "'sentence_index'" in line and "int32" in line


# ------------------------------------------------------------------------------------ (b) a pickle given as weights
class _Boom:
    """Unpickling this would write a file: the tests assert it never appears."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __reduce__(self):
        return (Path.write_text, (self.flag, "unpickled"))


def _pickles(tmp_path: Path) -> dict[str, Path]:
    import torch

    flag = tmp_path / "UNPICKLED"
    out = {"torch.save zip": tmp_path / "model.pt", "plain pickle": tmp_path / "weights.bin",
           "pickle named .safetensors": tmp_path / "fake.safetensors"}
    torch.save({"state_dict": {}, "boom": _Boom(flag)}, out["torch.save zip"])
    out["plain pickle"].write_bytes(pickle.dumps({"boom": _Boom(flag)}, protocol=4))
    out["pickle named .safetensors"].write_bytes(pickle.dumps(_Boom(flag), protocol=2))
    return out


def test_a_pickled_checkpoint_is_one_line_and_never_unpickled(tmp_path, capsys):
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    for kind, path in _pickles(tmp_path).items():
        capsys.readouterr()
        assert _score(data, tmp_path / "s", f"clip:arch=halsift-tiny,checkpoint={path}") == 2, kind
        line = _err_line(capsys)
        assert f"checkpoint: {path} is not a safetensors file" in line and "safetensors expected" in line, line
    assert not (tmp_path / "UNPICKLED").exists()


def test_train_clip_pretrained_pickle_is_one_line_and_never_unpickled(tmp_path, capsys):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=4)
    for kind, path in _pickles(tmp_path).items():
        capsys.readouterr()
        assert main(["train", "clip", "--data", str(data), "--out", str(tmp_path / "run"), "--model", "halsift-tiny",
                     "--pretrained", str(path), "--steps", "1", "--workers", "0", "--wandb-mode", "disabled"]) == 2
        line = _err_line(capsys)
        assert f"pretrained: {path} is not a safetensors file" in line, (kind, line)
    assert not (tmp_path / "UNPICKLED").exists()


def test_train_clip_resume_refuses_pickles_in_its_checkpoint(tmp_path, capsys):
    """``--resume`` from a checkpoint whose model.safetensors is a torch.save pickle: one line naming it; whose
    optimizer.bin is a pickle of a foreign object: one line naming the checkpoint (accelerate's restricted
    ``torch.load`` refuses it; nothing is unpickled)."""
    import torch

    data = make_corpus(tmp_path / "c", shards=2, per_shard=4)
    run = tmp_path / "run"
    args = ["train", "clip", "--data", str(data), "--out", str(run), "--model", "halsift-tiny", "--batch-size", "4",
            "--workers", "0", "--wandb-mode", "disabled", "--warmup", "1", "--checkpoint-every", "1"]
    assert main([*args, "--steps", "1"]) == 0
    ckpt = run / "checkpoints" / "step_000001"
    good = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    flag = tmp_path / "UNPICKLED"
    torch.save({"boom": _Boom(flag)}, ckpt / "model.safetensors")
    capsys.readouterr()
    assert main([*args, "--steps", "2", "--resume"]) == 2
    line = _err_line(capsys)
    assert f"checkpoint: {ckpt / 'model.safetensors'} is not a safetensors file" in line
    (ckpt / "model.safetensors").write_bytes(good["model.safetensors"])
    (ckpt / "optimizer.bin").write_bytes(pickle.dumps(_Boom(flag)))
    assert main([*args, "--steps", "2", "--resume"]) == 2
    line = _err_line(capsys)
    assert f"checkpoint {ckpt}: cannot be loaded" in line and "not unpickled" in line
    assert not flag.exists()
    (ckpt / "optimizer.bin").write_bytes(good["optimizer.bin"])
    assert main([*args, "--steps", "2", "--resume"]) == 0  # the restored checkpoint resumes


# ------------------------------------------------------------------------------------ (c) a full disk names the file
def _full_disk(monkeypatch, module, name: str, after: int = 0) -> None:
    """``module.name`` raises ENOSPC (as ``write`` does on a full disk: no file name) after ``after`` calls."""
    real, calls = getattr(module, name), [0]

    def full(*a, **kw):
        calls[0] += 1
        if calls[0] > after:
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        return real(*a, **kw)

    monkeypatch.setattr(module, name, full)


def test_full_disk_while_scoring_names_the_part(tmp_path, monkeypatch, capsys):
    data = make_corpus(tmp_path / "c", shards=2, per_shard=3)
    _full_disk(monkeypatch, pq, "write_table", after=1)  # the second part
    capsys.readouterr()
    assert _score(data, tmp_path / "s") == 2
    line = _err_line(capsys)
    assert line == f"halsift score: error: {tmp_path / 's' / 'part-000001.parquet'}: No space left on device"
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".part-")]  # no temp file left


def test_full_disk_while_selecting_names_the_shard_or_file(scored, tmp_path, monkeypatch, capsys):
    import tarfile

    data, rand = scored
    _full_disk(monkeypatch, tarfile.TarFile, "addfile", after=4)
    capsys.readouterr()
    assert _select(rand, data, tmp_path / "sel") == 2
    assert _err_line(capsys) == f"halsift select: error: {tmp_path / 'sel' / '000000.tar'}: No space left on device"
    monkeypatch.undo()
    _full_disk(monkeypatch, pq, "write_table")  # kept.parquet, after the shards
    assert _select(rand, data, tmp_path / "sel2") == 2
    assert _err_line(capsys) == f"halsift select: error: {tmp_path / 'sel2' / 'kept.parquet'}: No space left on device"


def test_full_disk_while_writing_a_report_names_it(scored, tmp_path, monkeypatch, capsys):
    data, rand = scored
    assert _select(rand, data, tmp_path / "sel") == 0
    _full_disk(monkeypatch, Path, "write_text")  # index.html, through write_text_atomic
    assert main(["select", "--scores", str(rand), "--data", str(data), "--out", str(tmp_path / "sel2"),
                 "--keep", "0.5", "--no-progress", "--html"]) == 2
    assert _err_line(capsys) == f"halsift select: error: {tmp_path / 'sel2' / 'index.html'}: No space left on device"


def test_an_error_that_names_its_file_keeps_it(tmp_path):
    from halsift.corpus.atomic import atomic_file

    with pytest.raises(PermissionError, match="elsewhere"):
        with atomic_file(tmp_path / "a.json"):
            raise PermissionError(errno.EACCES, "Permission denied", "elsewhere")
    with pytest.raises(OSError, match=r"a\.json") as e:
        with atomic_file(tmp_path / "a.json"):
            raise OSError(errno.EIO, "Input/output error")
    assert e.value.errno == errno.EIO and e.value.filename == str(tmp_path / "a.json")
    assert list(tmp_path.iterdir()) == []
