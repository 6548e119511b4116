"""Issue 32: ``--unit caption --agg repair`` keeps a caption's good sentences, cuts a localizing detector's flagged
words from a flagged sentence, and drops a flagged sentence it did not localize."""

from __future__ import annotations

import json

from filtering_data import png
import random

from halsift.corpus.scores import scores_table, write_part_atomic
from halsift.corpus.shards import Sample, ShardWriter, iter_samples
from halsift.filtering.selection.repair import cut_spans, repaired_label
from halsift.launch.cli import main

SENTS = [
    {"text": "A dog sits on grass.", "label": "correct", "spans": []},
    {"text": "A red car is parked behind it.", "label": "incorrect", "spans": [[1, 2]]},  # 'red' is wrong
    {"text": "Two birds fly.", "label": "incorrect", "spans": [[0, 1]]},
]


def _world(tmp_path):
    rng = random.Random(0)
    with ShardWriter(tmp_path / "data", maxcount=10) as w:
        w.write(Sample("k0", png(rng), " ".join(s["text"] for s in SENTS), {
            "captioner": "capA", "source": "i2t", "sentences": [{**s, "position": i} for i, s in enumerate(SENTS)]},
            "png"))
        w.write(Sample("k1", png(rng), "A cat. A hat.", {"captioner": "capA", "source": "i2t"}, "png"))
    shard = next((tmp_path / "data").glob("*.tar"))
    scores = tmp_path / "scores"
    scores.mkdir()
    # sentence 0 passes (90); sentence 1 flagged (10) with the span 'red' localized; sentence 2 flagged without spans;
    # k1: both flagged, no spans -> nothing left, dropped
    t = scores_table(["k0", "k0", "k0", "k1", "k1"], [0, 1, 2, 0, 1], [90, 10, 5, 20, 30], [True] * 5, "loc",
                     {"captioner": ["capA"] * 5, "spans": [[], [[1, 2]], [], [], []]})
    write_part_atomic(t, scores / f"part-{shard.stem}.parquet")
    (scores / "_manifest.json").write_text(json.dumps({"status": "complete", "detector": "loc",
                                                       "detector_name": "loc"}))
    return tmp_path / "data", scores


def test_repair_cuts_the_flagged_span_and_drops_unlocalized_flagged_sentences(tmp_path, capsys):
    data, scores = _world(tmp_path)
    outs = {}
    for agg in ("repair", "prune"):
        rc = main(["select", "--scores", str(scores), "--data", str(data), "--out", str(tmp_path / agg),
                   "--threshold", "50", "--unit", "caption", "--agg", agg, "--no-progress"])
        assert rc == 0, capsys.readouterr().err
        outs[agg] = {s.key: s for s in iter_samples(tmp_path / agg)}
    rep = outs["repair"]
    assert set(rep) == {"k0"}
    assert rep["k0"].caption == "A dog sits on grass. A car is parked behind it."
    sents = rep["k0"].meta["sentences"]
    assert [s["text"] for s in sents] == ["A dog sits on grass.", "A car is parked behind it."]
    assert [s["label"] for s in sents] == ["correct", "correct"]  # the cut covered the labelled span
    assert rep["k0"].meta["kept_sentence_indices"] == [0] and rep["k0"].meta["repaired_sentence_indices"] == [1]
    assert outs["prune"]["k0"].caption == "A dog sits on grass."  # prune drops the flagged sentence whole
    m = json.loads((tmp_path / "repair" / "manifest.json").read_text())
    assert m["repaired_sentences"] == 1
    assert m["sentence_precision"]["kept"] == 100.0


def test_cut_spans_and_label():
    assert cut_spans("A red car is parked.", [[1, 2], [4, 5]]) == "A car is"
    assert repaired_label({"label": "incorrect", "spans": [[1, 3]]}, [[1, 2]]) == "incorrect"  # 'car' left
    assert repaired_label({"label": "incorrect", "spans": [[1, 3]]}, [[0, 3]]) == "correct"
    assert repaired_label({"label": "incorrect", "spans": []}, [[0, 1]]) == "incorrect"  # unknown where
