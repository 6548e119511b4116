"""A recipe ensemble's score folder keeps the samples' other columns (the captioner the guarantee restricts its
calibration to), with the members' mean as its score."""

import pyarrow.parquet as pq
import pytest

from halsift.corpus.scores import scores_table, write_part_atomic
from halsift.launch.stages.score import write_ensemble


def test_ensemble_carries_the_captioner_column(tmp_path):
    keys, idx = ["a", "a", "b"], [0, 1, 0]
    for name, score in (("m1", [10.0, 20.0, 30.0]), ("m2", [30.0, 40.0, 50.0])):
        (tmp_path / name).mkdir()
        write_part_atomic(scores_table(keys, idx, score, [True] * 3, name,
                                       extra={"captioner": ["cap-x", "cap-x", "cap-y"]}),
                          tmp_path / name / "part-0.parquet")
    write_ensemble("ens", [tmp_path / "m1", tmp_path / "m2"], tmp_path / "ens")
    t = pq.read_table(tmp_path / "ens" / "part-ensemble.parquet").to_pydict()
    assert t["captioner"] == ["cap-x", "cap-x", "cap-y"] and t["score"] == pytest.approx([20.0, 30.0, 40.0])
