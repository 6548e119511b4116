"""Issue 51, rule 1, from the command line: every command refuses a value outside an option's declared range in one
line naming the flag, exit 2, before any folder is touched (NaN and inf where a finite number is meant: cause 6);
`select --memory-limit` is a size DuckDB reads, parsed once, checked against [16MB, this machine's memory] (cause 5);
the detector families' ranges (the cascade's budget/keep/sample ...) are refused by `score`, `check_spec` and a
recipe's `--dry-run` alike, and shown by `--describe`."""

from __future__ import annotations

import json

import pytest
from cli_cases import _err_line as _one_line
from cli_cases import scored  # noqa: F401 (a fixture: a corpus and its random scores)

from halsift.corpus.ranges import machine_memory
from halsift.launch.cli import main


# (argv after the command's required flags, the flag the line names, what it says)
CASES = {
    "score": [(["--batch-size", "0"], "--batch-size: expected a value in [1, inf), got 0"),
              (["--max-parse-failures", "nan"], "--max-parse-failures: expected a finite value in [0, 1], got nan")],
    "select": [(["--keep", "nan"], "--keep: expected a finite value in (0, 1], got nan"),
               (["--top-k", "-1"], "--top-k: expected a value in [0, inf), got -1"),
               (["--threshold", "101"], "--threshold: expected a value in [0, 100], got 101.0"),
               (["--random", "--seed", "-1"], "--seed: expected a value in [0, inf), got -1"),
               (["--maxcount", "0"], "--maxcount: expected a value in [1, inf), got 0"),
               (["--max-hallucination", "0.3", "--confidence", "1"], "--confidence: expected a value in (0, 1)")],
    "embed": [(["--batch-size", "0"], "--batch-size: expected a value in [1, inf), got 0")],
    "dedup": [(["--cosine", "inf"], "--cosine: expected a finite value in [-1, 1], got inf"),
              (["--phash-distance", "33"], "--phash-distance: expected a value in [0, 32], got 33")],
    "annotate": [(["--n", "0"], "--n: expected a value in [1, inf), got 0"),
                 (["--seed", "-3"], "--seed: expected a value in [0, inf), got -3")],
    "train clip": [(["--lr", "nan"], "--lr: expected a finite value in [0, inf), got nan"),
                   (["--steps", "0"], "--steps: expected a value in [1, inf), got 0"),
                   (["--beta2", "1"], "--beta2: expected a value in [0, 1), got 1.0")],
    "train detector": [(["--lr", "nan"], "--lr: expected a finite value in [0, inf), got nan"),
                       (["--lora-dropout", "1"], "--lora-dropout: expected a value in [0, 1), got 1.0"),
                       (["--warmup", "-1"], "--warmup: expected a value in [0, inf), got -1")],
    "eval bench": [(["--n-boot", "5"], "--n-boot: expected a value in [10, inf), got 5")],
}


def _argv(command: str, corpus, scores, out) -> list[str]:
    data, bench, out = str(corpus), str(corpus.parent / "b.jsonl"), str(out)
    return {"score": ["--detector", "oracle", "--data", data, "--out", out],
            "select": ["--scores", str(scores), "--data", data, "--out", out],
            "embed": ["--model", "clip:arch=halsift-tiny,pretrained=random", "--data", data, "--out", out],
            "dedup": ["--data", data, "--out", out],
            "annotate": ["--scores", str(scores), "--data", data, "--out", out],
            "train clip": ["--data", data, "--out", out, "--model", "halsift-tiny"],
            "train detector": ["--base", "clip:arch=halsift-tiny,pretrained=random", "--bench", bench, "--out", out],
            "eval bench": ["--bench", bench, "--detector", "oracle", "--out", out]}[command]


@pytest.mark.parametrize("command, extra, message", [(c, a, m) for c, cases in CASES.items() for a, m in cases],
                         ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_a_value_outside_its_range_is_refused_before_anything_is_written(scored, tmp_path, capsys, command, extra,
                                                                          message):
    corpus, scores = scored
    assert main([*command.split(), *_argv(command, corpus, scores, tmp_path / "out"), *extra]) == 2
    assert message in _one_line(capsys)
    assert not (tmp_path / "out").exists()


def test_train_detector_teacher_checks_the_same_options(scored, tmp_path, capsys):
    _, scores = scored
    assert main(["train", "detector", "--teacher", str(scores), "--embeddings", str(tmp_path / "emb"), "--out",
                 str(tmp_path / "out"), "--lr", "inf"]) == 2
    assert "--lr: expected a finite value in [0, inf), got inf" in _one_line(capsys)


# ------------------------------------------------------------------------------------------ select --memory-limit
@pytest.mark.parametrize("limit, message", [
    ("abc", "expected a size such as 512MB or 2GiB"), ("0", "expected a size such as 512MB"),
    ("1e3", "expected a size such as 512MB"), ("10KB", "expected a size in [16MB, RAM]"),
    ("999999999999TB", "expected a size in [16MB, RAM]"), ("80%", "expected a size such as 512MB"),
    (f"{machine_memory() * 2 // 10 ** 6}MB", "(RAM: this machine's memory,"),
])
def test_a_memory_limit_duckdb_cannot_take_is_one_line_before_the_folder_is_touched(scored, tmp_path, capsys, limit,
                                                                                   message):
    corpus, scores = scored
    manifest = (scores / "_manifest.json").read_text()
    assert main(["select", "--scores", str(scores), "--data", str(corpus), "--out", str(tmp_path / "out"),
                 "--memory-limit", limit, "--no-progress"]) == 2
    line = _one_line(capsys)
    assert line.startswith("halsift select: error: --memory-limit: ") and message in line, line
    assert not (tmp_path / "out").exists() and (scores / "_manifest.json").read_text() == manifest


def test_a_memory_limit_in_range_reaches_duckdb_as_bytes(scored, tmp_path, capsys):
    corpus, scores = scored
    assert main(["select", "--scores", str(scores), "--data", str(corpus), "--out", str(tmp_path / "sel"),
                 "--memory-limit", "64 MiB", "--keep", "0.5", "--no-progress"]) == 0
    assert json.loads((tmp_path / "sel" / "manifest.json").read_text())["status"] == "complete"


def test_duckdb_running_out_of_memory_is_one_line_asking_for_more(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from halsift.filtering.selection.out_of_core import top_keys
    from halsift.filtering.selection.select import SelectError

    (tmp_path / "s").mkdir()
    n = 200_000
    pq.write_table(pa.table({"key": [f"k{i // 4}" for i in range(n)], "sentence_index": pa.array(np.arange(n) % 4,
                                                                                              pa.int32()),
                             "score": pa.array(np.random.default_rng(0).random(n) * 100, pa.float32())}),
                   tmp_path / "s" / "part-000000.parquet")
    with pytest.raises(SelectError, match=r"^--memory-limit 16MB: DuckDB ran out of memory .*give a larger "
                                          r"--memory-limit$"):
        top_keys(tmp_path / "s", tmp_path / "o", keep=0.2, memory_limit="16MB", threads=64)


# ------------------------------------------------------------------------------------------ detector families
@pytest.mark.parametrize("spec, message", [
    ("cascade:cheap=[random],judge=[oracle],budget=0", "budget: expected a value in (0, 1], got 0"),
    ("cascade:cheap=[random],judge=[oracle],keep=1.5", "keep: expected a value in (0, 1], got 1.5"),
    ("cascade:cheap=[random],judge=[oracle],sample=.nan", "sample: expected a finite value in (0, 1], got nan"),
    ("cascade:cheap=[random:seed=-1],judge=[oracle]", "seed: expected a value in [0, inf), got -1"),
    ("ensemble:members=[oracle;random],weights=[1,-2]", "weights: expected a value in [0, inf), got -2.0"),
    ("clip:arch=halsift-tiny,pretrained=random,center=2", "center: expected a value in [-1, 1], got 2.0"),
    ("api:base_url=http://localhost:1/v1,model=m,timeout=0", "timeout: expected a value in (0, inf), got 0"),
    ("vlm:model=m,mode=pmi,references=r,temperature=0", "temperature: expected a value in (0, inf), got 0"),
    ("lora:/nowhere,forward_batch=0", "forward_batch: expected a value in [1, inf), got 0"),
])
def test_a_detector_option_outside_its_range_is_refused_by_score_and_the_dry_run(scored, tmp_path, capsys, spec,
                                                                                  message, monkeypatch):
    corpus, _ = scored
    assert main(["score", "--detector", spec, "--data", str(corpus), "--out", str(tmp_path / "o"),
                 "--no-progress"]) == 2
    assert message in _one_line(capsys)
    assert not (tmp_path / "o").exists()  # before any stage ran
    monkeypatch.chdir(tmp_path)
    assert main(["run", "quickstart", "--dry-run", f"score.detectors.x={spec}"]) == 2
    line = _one_line(capsys)
    assert "score.detectors.x" in line and message in line, line


def test_describe_shows_the_ranges(capsys):
    with pytest.raises(SystemExit, match="^0$"):
        main(["score", "--describe"])
    out = capsys.readouterr().out
    assert "budget: float in (0, 1] = 0.25" in out and "keep: float in (0, 1] = 0.2" in out
    assert "batch_size: 64  # items per detector call (in [1, inf))" in out
    with pytest.raises(SystemExit, match="^0$"):
        main(["select", "--describe"])
    assert "memory_limit: null  # " in (out := capsys.readouterr().out) and "(in [16MB, RAM])" in out


@pytest.mark.parametrize("override, message", [
    ("finetune.lr=.nan", "finetune.lr: expected a finite value in [0, inf), got nan"),
    ("select.variants.half={filter: clip, keep: 2}", "select.variants.half.keep: expected a value in [0, 1], got 2"),
    ("dedup.cosine=3", "dedup.cosine: expected a value in [-1, 1], got 3"),
    ("finetune.seeds=[0,-1]", "finetune.seeds: expected a value in [0, inf), got -1"),
])
def test_a_recipe_dry_run_checks_the_same_ranges(tmp_path, capsys, monkeypatch, override, message):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "quickstart", "--dry-run", override]) == 2
    assert message in _one_line(capsys)
