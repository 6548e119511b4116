"""Regression tests from the reliability probes (issues 19 and 35), by stage: Evaluations: an unreadable input file is
one line naming it."""

from __future__ import annotations

from pathlib import Path

from cli_cases import _err_line

from halsift.launch.cli import main


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
    args = ["eval", "retrieval", "--model", "halsift-tiny", "--pretrained", "random", "--device", "cpu", "--out",
            str(tmp_path / "ev")]
    assert main([*args, "--data", str(bad)]) == 2
    line = _err_line(capsys)
    assert "1.png" in line and "cannot read image" in line and not (tmp_path / "ev" / "metrics.json").exists()
    good = _retrieval_set(tmp_path / "good", broken=False)
    garbage = tmp_path / "model.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    assert main([*args, "--data", str(good), "--pretrained", str(garbage)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"halsift eval retrieval: error: --pretrained '{garbage}': ")
    assert "not a valid safetensors file" in err[-1] and "Hugging Face" not in err[-1]
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "ev" / "metrics.json").exists()


# ------------------------------------------------------------------------------- T6. eval input files with missing columns
def test_ihalla_qa_file_missing_a_column_is_one_line(tmp_path, capsys):
    (tmp_path / "qa.csv").write_text("index,CoI,question\n1,x,What is shown?\n")
    (tmp_path / "pred.csv").write_text("generator,index,question_no,prediction\nsd,1,1,A\n")
    assert main(["eval", "ihalla", "--qa", str(tmp_path / "qa.csv"), "--predictions", str(tmp_path / "pred.csv"),
                 "--out", str(tmp_path / "o")]) == 2
    line = _err_line(capsys)
    assert "qa.csv" in line and "no 'answer' column" in line
