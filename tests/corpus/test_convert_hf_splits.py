"""`halsift convert hf` of a DatasetDict: each sample's split recorded, `--split` converting some splits, and a
wrong split named with the ones the folder holds (the layout `DatasetDict.save_to_disk` writes, built with pyarrow:
`dataset_dict.json` {"splits": [...]} and one `Dataset.save_to_disk` folder per split)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest
from img2dataset_data import jpeg

from halsift.corpus.shards import iter_samples
from halsift.launch.cli import main


def _dataset(folder: Path, captions: list[str], split: str | None, rng: random.Random, columns: dict = {}) -> None:
    """One ``Dataset.save_to_disk`` folder: an Arrow stream file, ``dataset_info.json`` and ``state.json``."""
    folder.mkdir(parents=True)
    t = pa.table({"image": [{"bytes": jpeg(rng), "path": None} for _ in captions], "caption": captions, **columns})
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, t.schema) as w:
        w.write_table(t)
    (folder / "dataset_info.json").write_text("{}")
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}],
                                                   "_fingerprint": "x", "_format_type": None, "_split": split}))


@pytest.fixture
def dataset_dict(tmp_path) -> Path:
    """train (3 rows), validation (1), test (2); each caption names its split."""
    rng, d = random.Random(0), tmp_path / "hf"
    sizes = {"train": 3, "validation": 1, "test": 2}
    for name, n in sizes.items():
        _dataset(d / name, [f"A {name} picture {i}." for i in range(n)], name, rng)
    (d / "dataset_dict.json").write_text(json.dumps({"splits": list(sizes)}))
    return d


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _samples(folder: Path) -> dict:
    return {s.key: s for s in iter_samples(folder)}


def test_datasetdict_records_each_samples_split(dataset_dict, tmp_path, capsys):
    assert main(["convert", "hf", str(dataset_dict), "--out", str(tmp_path / "all")]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["samples"] == 6 and summary["splits"] == ["train", "validation", "test"]
    got = _samples(tmp_path / "all")
    assert len(got) == 6
    for s in got.values():
        assert s.meta["split"] in ("train", "validation", "test")
        assert s.caption.startswith(f"A {s.meta['split']} picture")  # the split the row came from
    assert {k for k, s in got.items() if s.meta["split"] == "test"} == {"test-000000000", "test-000000001"}


def test_split_flag_converts_only_those_splits_with_the_same_keys(dataset_dict, tmp_path, capsys):
    assert main(["convert", "hf", str(dataset_dict), "--out", str(tmp_path / "all")]) == 0
    assert main(["convert", "hf", str(dataset_dict), "--out", str(tmp_path / "test"), "--split", "test"]) == 0
    every, test = _samples(tmp_path / "all"), _samples(tmp_path / "test")
    assert {s.meta["split"] for s in test.values()} == {"test"} and len(test) == 2
    for k, s in test.items():  # keys do not depend on which splits were converted
        assert every[k].caption == s.caption and every[k].image == s.image
    assert main(["convert", "hf", str(dataset_dict), "--out", str(tmp_path / "two"),
                 "--split", "train,validation"]) == 0
    assert sorted(s.meta["split"] for s in _samples(tmp_path / "two").values()) == ["train"] * 3 + ["validation"]


def test_wrong_split_names_the_available_ones(dataset_dict, tmp_path, capsys):
    assert main(["convert", "hf", str(dataset_dict), "--out", str(tmp_path / "x"), "--split", "valid"]) == 2
    err = _err(capsys)
    assert "no split 'valid'" in err and "splits: train, validation, test" in err and str(dataset_dict) in err
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").glob("*.tar"))


def test_single_dataset_records_its_state_split_and_refuses_another(tmp_path, capsys):
    """A single ``Dataset`` saved from ``load_dataset(..., split="validation")`` carries its split in state.json;
    a row's own ``split`` column wins over it."""
    rng = random.Random(1)
    _dataset(tmp_path / "one", ["One.", "Two."], "validation", rng)
    assert main(["convert", "hf", str(tmp_path / "one"), "--out", str(tmp_path / "a")]) == 0
    got = _samples(tmp_path / "a")
    assert sorted(got) == ["000000000", "000000001"]  # a single Dataset keeps row-number keys
    assert {s.meta["split"] for s in got.values()} == {"validation"}
    assert main(["convert", "hf", str(tmp_path / "one"), "--out", str(tmp_path / "b"), "--split", "train"]) == 2
    assert "no split 'train' (splits: validation)" in _err(capsys)

    _dataset(tmp_path / "col", ["One.", "Two."], None, rng, {"split": ["karpathy-test", "karpathy-val"]})
    assert main(["convert", "hf", str(tmp_path / "col"), "--out", str(tmp_path / "c")]) == 0
    assert sorted(s.meta["split"] for s in _samples(tmp_path / "c").values()) == ["karpathy-test", "karpathy-val"]
    assert main(["convert", "hf", str(tmp_path / "col"), "--out", str(tmp_path / "d"), "--split", "test"]) == 2
    assert "single Dataset with no recorded split" in _err(capsys)


def test_split_refused_where_unused_and_split_names_checked(dataset_dict, tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text(json.dumps({"image": "a.jpg", "caption": "A."}) + "\n")
    assert main(["convert", "table", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "t"), "--split", "test"]) == 2
    assert "--split: not used by table" in _err(capsys)
    (dataset_dict / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "../elsewhere"]}))
    assert main(["convert", "hf", str(dataset_dict), "--out", str(tmp_path / "h")]) == 2
    assert "split '../elsewhere' is not a folder name" in _err(capsys)
