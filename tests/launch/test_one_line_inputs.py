"""Bad inputs of issue 41, each one line naming the file or key, exit 2, found before anything is written where
it can be checked up front: a --fields table whose key column is not text, a zero-shot template that does more
than place {c}, a SugarCrepe filename outside its image folder, a .npy subset without uids."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "eval"))
from test_compositional import sugarcrepe_fixture  # noqa: E402
from test_zeroshot import wds_fixture  # noqa: E402

from halsift.launch.cli import main  # noqa: E402


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err, captured.err
    return err[0]


# ---------------------------------------------------------------- --fields key type
@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    from filtering_data import make_corpus

    from halsift.filtering.scoring.runner import score

    d = tmp_path_factory.mktemp("fk")
    corpus = make_corpus(d / "corpus", shards=2, per_shard=4)
    score("random:seed=1", corpus, d / "judge", show_progress=False)
    return corpus, d


@pytest.mark.parametrize("keys", [pa.array(range(8), pa.int64()), pa.array([0.5 * i for i in range(8)]),
                                  pa.array([True, False] * 4), pa.array([b"k"] * 8, pa.binary())])
def test_fields_key_column_that_is_not_text(scored, tmp_path, capsys, keys):
    corpus, d = scored
    f = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"key": keys, "q": list(range(8))}), f)
    assert main(["select", "--scores", f"judge={d / 'judge'}", "--fields", str(f), "--where", "q > 1", "--data",
                 str(corpus), "--out", str(tmp_path / "s"), "--keep", "1", "--no-progress"]) == 2
    err = _one_line(capsys)
    assert "ints.parquet" in err and "'key' column" in err and "strings" in err
    assert not (tmp_path / "s").exists()


def test_fields_key_column_as_large_string_is_fine(scored, tmp_path):
    from halsift.corpus.scores import read_scores_df

    corpus, d = scored
    keys = sorted(read_scores_df(d / "judge")["key"].unique())
    f = tmp_path / "ls.parquet"
    pq.write_table(pa.table({"key": pa.array(keys, pa.large_string()), "q": list(range(len(keys)))}), f)
    assert main(["select", "--scores", f"judge={d / 'judge'}", "--fields", str(f), "--where", "q >= 4", "--data",
                 str(corpus), "--out", str(tmp_path / "s"), "--keep", "1", "--no-progress"]) == 0
    kept = set(pq.read_table(tmp_path / "s" / "kept.parquet")["key"].to_pylist())
    assert kept == set(keys[4:])


# ---------------------------------------------------------------- zero-shot templates
@pytest.mark.parametrize("template", ["a photo of a {c.upper}.", "a {c.__class__.__name__}", "a {c[0]} thing",
                                      "a {0} photo", "a {} photo", "a {d} photo", "a {c!r:{w}}"])
def test_zeroshot_template_that_does_more_than_place_c(tmp_path, capsys, template):
    root = wds_fixture(tmp_path / "fix")
    (root / "zeroshot_classification_templates.txt").write_text(f"a photo of a {{c}}.\n{template}\n")
    code = main(["eval", "zeroshot", "--model", "halsift-tiny", "--pretrained", "random", "--device", "cpu",
                 "--data", str(root), "--out", str(tmp_path / "o")])
    err = _one_line(capsys)
    assert code == 2 and re.search(r"zeroshot_classification_templates\.txt:2: template .* does not format", err), err
    assert not (tmp_path / "o" / "metrics.json").exists()


def test_zeroshot_template_with_a_format_spec_is_fine(tmp_path):
    from halsift.corpus.classification import read_classification

    root = wds_fixture(tmp_path / "fix")
    (root / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\n[{c:>6}] {{braces}}\n")
    cset = read_classification(root)
    assert cset.prompts("cat") == ["a photo of a cat.", "[   cat] {braces}"]


# ---------------------------------------------------------------- SugarCrepe filenames
@pytest.mark.parametrize("filename", ["../../secret.png", "../outside.png", "/etc/hostname", "sub/../../x.png"])
def test_compositional_filename_outside_its_image_folder(tmp_path, capsys, filename):
    root = sugarcrepe_fixture(tmp_path / "sc")
    (tmp_path / "outside.png").write_bytes((root / "images" / "0.png").read_bytes())
    (tmp_path / "secret.png").write_bytes((root / "images" / "0.png").read_bytes())
    data = json.loads((root / "add_obj.json").read_text())
    data["7"]["filename"] = filename
    (root / "add_obj.json").write_text(json.dumps(data))
    code = main(["eval", "compositional", "--model", "halsift-tiny", "--pretrained", "random", "--device", "cpu",
                 "--data", str(root), "--out", str(tmp_path / "o")])
    err = _one_line(capsys)
    assert code == 2 and "add_obj.json: id '7'" in err and "outside the image folder" in err, err
    assert not (tmp_path / "o" / "metrics.json").exists()


def test_compositional_filename_in_a_subfolder_is_fine(tmp_path):
    from halsift.corpus.sugarcrepe import read_category

    root = sugarcrepe_fixture(tmp_path / "sc")
    (root / "images" / "sub").mkdir()
    (root / "images" / "sub" / "z.png").write_bytes((root / "images" / "0.png").read_bytes())
    (root / "x.json").write_text(json.dumps({"1": {"filename": "sub/./z.png", "caption": "a", "negative_caption": "b"}}))
    assert [p.image.name for p in read_category(root / "x.json", root / "images")] == ["z.png"]


# ---------------------------------------------------------------- --export-keys up front
@pytest.mark.parametrize("engine", [[], ["--resumable"]])
def test_export_npy_without_uid_fails_before_anything_is_written(tmp_path, capsys, engine):
    from img2dataset_data import make_img2dataset

    plain = make_img2dataset(tmp_path / "plain")
    assert main(["score", "--detector", "random:seed=0", "--data", str(plain), "--out", str(tmp_path / "sc"),
                 "--no-progress"]) == 0
    capsys.readouterr()
    out = tmp_path / "sel"
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(plain), "--out", str(out), "--keep",
                 "0.5", "--export-keys", str(tmp_path / "x.npy"), "--no-progress", *engine]) == 2
    err = _one_line(capsys)
    assert "--export-keys" in err and "json field 'uid' is missing" in err and ".tar" in err
    assert not out.exists() and not (tmp_path / "x.npy").exists()
    # the key list needs no uid: the same selection goes through
    assert main(["select", "--scores", str(tmp_path / "sc"), "--data", str(plain), "--out", str(out), "--keep",
                 "0.5", "--export-keys", str(tmp_path / "keys.txt"), "--no-progress", *engine]) == 0
    assert (tmp_path / "keys.txt").read_text().strip()
