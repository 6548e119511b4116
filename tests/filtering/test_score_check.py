"""One check of a score folder for both selections: `select` (in memory) and `select --resumable` (out-of-core) refuse
the same bad folders with the same one-line error, and write nothing."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from filtering_data import restamp, scored_corpus

from halsift.launch.cli import main


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    return scored_corpus(tmp_path_factory.mktemp("chk"), shards=3, per_shard=5, seed=2)


def _no_manifest(s):
    (s / "_manifest.json").unlink()


def _listed_part_missing(s):
    (s / "part-000001.parquet").unlink()


def _corrupt_part(s):
    (s / "part-000001.parquet").write_bytes(b"PAR1 not really parquet")


def _foreign_detector(s):
    t = pq.read_table(s / "part-000002.parquet")
    pq.write_table(t.set_column(t.schema.get_field_index("detector"), "detector",
                                pa.array(["oracle"] * len(t))), s / "part-000002.parquet")


def _mixed_without_manifest_detector(s):
    _foreign_detector(s)
    m = json.loads((s / "_manifest.json").read_text())
    del m["detector_name"]
    (s / "_manifest.json").write_text(json.dumps(m))


def _score_task_unfinished(s):
    m = json.loads((s / "_manifest.json").read_text())
    m = {k: v for k, v in m.items() if k != "part_files"}
    (s / "_manifest.json").write_text(json.dumps({**m, "status": "running"}))
    (s / "part-000002.parquet").unlink()
    (s / "_claims").mkdir()
    (s / "_claims" / "part-000002.parquet.0").write_text(json.dumps({"host": "elsewhere", "pid": 1}))


def _index_below_minus_one(s):
    t = pq.read_table(s / "part-000000.parquet")
    idx = pc.cast(t["sentence_index"], pa.int32()).to_pylist()
    pq.write_table(t.set_column(1, "sentence_index", pa.array([-5] + idx[1:], pa.int32())),
                   s / "part-000000.parquet")


CASES = {
    "no manifest": (_no_manifest, ["_manifest.json: the score manifest is missing", "--allow-partial"]),
    "listed part missing": (_listed_part_missing, ["part-000001.parquet is listed in _manifest.json but missing"]),
    "corrupt part": (_corrupt_part, ["part-000001.parquet is not a readable parquet file"]),
    "foreign detector": (_foreign_detector, ["part-000002.parquet holds scores of detector 'oracle'", "foreign"]),
    "mixed detectors": (_mixed_without_manifest_detector, ["part-000002.parquet holds detector 'oracle' but",
                                                          "choose one with --detector"]),
    "score tasks unfinished": (_score_task_unfinished, ["says status 'running'",
                                                        "score tasks still hold 1 unwritten part(s)"]),
    "index below -1": (_index_below_minus_one, ["part-000000.parquet has sentence_index -5"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_in_memory_and_resumable_select_give_the_same_error(scored, tmp_path, capsys, case):
    corpus, scores = scored
    bad = tmp_path / "scores"
    shutil.copytree(scores, bad)
    spoil, expected = CASES[case]
    spoil(bad)
    errs = {}
    for how, extra in (("in memory", []), ("resumable", ["--resumable"])):
        capsys.readouterr()
        out = tmp_path / f"sel-{how.replace(' ', '-')}"
        code = main(["select", "--scores", str(bad), "--data", str(corpus), "--out", str(out), "--keep", "0.5",
                     "--no-progress", *extra])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (how, lines)
        errs[how] = lines[0]
        assert not list(out.glob("*.tar")) and not (out / "manifest.json").exists()
    assert errs["in memory"] == errs["resumable"]
    assert str(bad) in errs["resumable"] and all(x in errs["resumable"] for x in expected), errs["resumable"]


def test_resumable_select_of_one_detector_in_a_mixed_folder_equals_in_memory(scored, tmp_path):
    from halsift.filtering.selection.select import select
    from halsift.filtering.selection.resumable import select_resumable

    corpus, scores = scored
    mixed = tmp_path / "scores"
    shutil.copytree(scores, mixed)
    name = json.loads((mixed / "_manifest.json").read_text())["detector_name"]
    t = pq.read_table(mixed / "part-000001.parquet")
    other = t.set_column(t.schema.get_field_index("detector"), "detector", pa.array(["oracle"] * len(t)))
    other = other.set_column(t.schema.get_field_index("score"), "score",
                             pc.subtract(pa.scalar(100, pa.float32()), t["score"]))
    pq.write_table(pa.concat_tables([t, other]), mixed / "part-000001.parquet")
    restamp(mixed)
    ref = select(mixed, corpus, tmp_path / "ref", keep=0.4, detector=name, show_progress=False)
    run = select_resumable(mixed, corpus, tmp_path / "res", keep=0.4, detector=name)["manifest"]
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in scores.glob("part-*.parquet"))
    assert run["score_rows"] == ref["score_rows"] == rows  # the other detector's rows are not counted
    assert pq.read_table(tmp_path / "res" / "kept.parquet").to_pydict() == \
        pq.read_table(tmp_path / "ref" / "kept.parquet").to_pydict()
    assert run["filter"]["detector"] == ref["filter"]["detector"] == name
