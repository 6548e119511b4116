"""AlignBench per-sentence table -> bench rows, on a hand-made table in CSV, parquet and JSONL."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from halsift.corpus.alignbench import (COLUMNS, AlignBenchFormatError, convert_alignbench, error_word_spans,
                                       generator_type, map_types)
from halsift.corpus.bench import read_bench
from halsift.corpus.sentences import words

ROWS = [
    # model, image_source, image_name, sentence_index, caption, annotation, error_type, error_words, n_c, n_i, n_u
    ("GPT4o", "cc12m", "img1.jpg", 1, "The image shows a red car.", "correct", "", "", 5, 0, 0),
    ("GPT4o", "cc12m", "img1.jpg", 2, "A sign reads \"Don't Feed the Dead\" in a scratchy font.", "incorrect",
     "text", "Don't Feed the Dead", 1, 4, 0),
    ("GPT4o", "cc12m", "img1.jpg", 3, "The air smells of rain.", "Unknown", "", "", 1, 1, 3),
    ("LLaVA-NeXT", "coco", "img1.jpg", 1, "Four skiers are in the frame, each wearing blue jackets.", "incorrect",
     "Number, attribute", "Four; blue", 2, 3, 0),
    ("SD", "t2i", "p7.png", 1, "An alpaca stands on the left side, gazing to the right.", "incorrect",
     "Location|Direction", "on the left side, to the right", 0, 5, 0),
    ("GPT-Gen", "t2i", "p7.png", 1, "A cup of tea rests on the arm rest of the chair.", "incorrect",
     "More", "on the arm rest", 2, 2, 1),
]


def _df():
    return pd.DataFrame(ROWS, columns=list(COLUMNS))


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_convert_table(tmp_path, fmt):
    df = _df()
    src = tmp_path / f"alignbench.{fmt}"
    if fmt == "csv":
        df.to_csv(src, index=False)
    elif fmt == "parquet":
        df.to_parquet(src)
    else:
        df.to_json(src, orient="records", lines=True)
    out = tmp_path / "bench" / "bench.jsonl"
    summary = convert_alignbench(src, out, images_dir=tmp_path / "images", image_template="{model}/{image_name}")
    assert summary["rows"] == 6 and summary["captions"] == 4 and summary["index_base"] == 1
    assert summary["labels"] == {"correct": 1, "incorrect": 4, "unknown": 1}
    rows = {r.id: r for r in read_bench(out)}
    r = rows["GPT4o-img1-1"]
    assert r.position == 1 and r.label == "incorrect" and r.types == ["Text"]
    assert words(r.sentence)[r.spans[0][0]:r.spans[0][1]] == ['"Don\'t', "Feed", "the", 'Dead"']
    assert r.spans == [[3, 7]]
    assert r.caption == ("The image shows a red car. A sign reads \"Don't Feed the Dead\" in a scratchy font. "
                         "The air smells of rain.")
    assert r.extra["n_correct"] == 1 and r.extra["n_incorrect"] == 4 and r.extra["n_unknown"] == 0
    assert r.image == "../images/GPT4o/img1.jpg" and r.image_id == "img1.jpg" and r.domain == "cc12m"
    assert r.generator_type == "i2t" and r.split == "test"
    assert rows["GPT4o-img1-2"].label == "unknown" and rows["GPT4o-img1-0"].label == "correct"
    assert rows["GPT4o-img1-0"].types == [] and rows["GPT4o-img1-0"].spans == []
    llava = rows["LLaVA-NeXT-img1-0"]
    assert llava.types == ["Number", "Attribute"] and llava.spans == [[0, 1], [8, 9]]
    sd = rows["SD-p7-0"]
    assert sd.generator_type == "t2i" and sd.types == ["Location", "Direction"]
    assert sd.spans == [[3, 7], [8, 11]]  # "on the left side," and "to the right."
    gen = rows["GPT-Gen-p7-0"]
    assert gen.generator_type == "t2i" and gen.types == ["Other"] and gen.spans == [[5, 9]]  # "on the arm rest"


def test_generator_types():
    for m in ("SD", "sd", "SD 3.5", "sd3.5", "Stable Diffusion", "stabilityai/stable-diffusion-3.5-medium",
              "GPT-Gen", "gpt-image-1"):
        assert generator_type(m) == "t2i", m
    for m in ("GPT4o", "gpt-4o", "ShareGPT", "S-GPT", "LLaVA-NeXT", "Llama-4", "Qwen-2", "CogVLM"):
        assert generator_type(m) == "i2t", m


def test_type_mapping_is_case_insensitive_and_unknown_is_other():
    assert map_types("OBJECT; illusion") == ["Object", "Illusion"]
    assert map_types(["Relation", "relation", "Weird"]) == ["Relation", "Other"]
    assert map_types(None) == [] and map_types(float("nan")) == [] and map_types("") == []


def test_error_words_repeated_and_unmatched():
    s = "A dog sits next to a dog bed."
    assert error_word_spans(s, ["dog", "dog"]) == ([[1, 2], [6, 7]], [])
    assert error_word_spans(s, "cat") == ([], ["cat"])
    assert error_word_spans(s, "Dog.") == ([[1, 2]], [])


def test_zero_based_index_and_sentence_column(tmp_path):
    df = _df().iloc[:2].copy()
    df["sentence_index"] = [0, 1]
    df["sentence"] = df["caption"]
    df["caption"] = "Whole caption here."
    rows_out = tmp_path / "b.jsonl"
    s = convert_alignbench(df, rows_out)
    rows = read_bench(rows_out)
    assert s["index_base"] == 0 and [r.position for r in rows] == [0, 1]
    assert rows[0].caption == "Whole caption here." and rows[1].sentence.startswith("A sign")
    assert rows[0].image == "img1.jpg"


def test_missing_column_is_named(tmp_path):
    df = _df().drop(columns=["error_words", "n_unknown"])
    with pytest.raises(AlignBenchFormatError, match="missing column\\(s\\) 'error_words', 'n_unknown'"):
        convert_alignbench(df, tmp_path / "b.jsonl")
    assert not (tmp_path / "b.jsonl").exists()


def test_bad_cells_name_row_and_column(tmp_path):
    df = _df()
    df.loc[2, "annotation"] = "maybe"
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(AlignBenchFormatError, match=r"t.csv: row 3: column 'annotation' is 'maybe'"):
        convert_alignbench(tmp_path / "t.csv", tmp_path / "b.jsonl")
    df = _df()
    df.loc[0, "n_correct"] = -1
    with pytest.raises(AlignBenchFormatError, match=r"row 1: column 'n_correct'"):
        convert_alignbench(df, tmp_path / "b.jsonl")
    df = _df()
    df.loc[1, "sentence_index"] = 1
    with pytest.raises(AlignBenchFormatError, match=r"row 2: .* repeats .*row 1"):
        convert_alignbench(df, tmp_path / "b.jsonl")
    with pytest.raises(FileNotFoundError, match=r"^AlignBench table: .*nope\.csv does not exist$"):
        convert_alignbench(tmp_path / "nope.csv", tmp_path / "b.jsonl")
    assert not (tmp_path / "b.jsonl").exists()


def test_unknown_extension(tmp_path):
    (tmp_path / "t.xlsx").write_text("x")
    with pytest.raises(AlignBenchFormatError, match="unknown table format"):
        convert_alignbench(tmp_path / "t.xlsx", tmp_path / "b.jsonl")


def test_output_is_plain_json(tmp_path):
    convert_alignbench(_df(), tmp_path / "b.jsonl")
    first = json.loads((tmp_path / "b.jsonl").read_text().splitlines()[0])
    assert first["n_correct"] == 5 and first["annotation"] == "correct" and first["generator"] == "GPT4o"
