"""Localization: parsing the seeds' **[...]** format, and IoU / AP / mIoU on hand-computed cases."""

from __future__ import annotations

import json

import pytest

from halsift.eval.metrics.localization import localization_metrics, parse_marked, set_iou, span_iou, unwrap_output


def test_parse_seed_example_and_json_block():
    assert parse_marked("A **[red]** bird singing in a tree.") == [(1, 2)]
    reply = '```json\n{\n "output": "A **[red]** bird singing in **[a tree.]**"\n}\n```\nBecause the bird is blue.'
    assert unwrap_output(reply) == "A **[red]** bird singing in **[a tree.]**"
    assert parse_marked(reply) == [(1, 2), (5, 7)]
    assert parse_marked('{"output": "**[Two dogs]** play."}') == [(0, 2)]
    assert parse_marked("Nothing wrong here.") == []
    assert parse_marked("A **[]** bird.") == []


def test_parse_word_indices_agree_with_sentence_words():
    words = pytest.importorskip("halsift.corpus.sentences").words
    sentence = "Two  small dogs,\tone brown, run on grass."
    marked = "Two  small dogs,\tone **[brown,]** run on grass."
    (s, e), = parse_marked(marked)
    assert words(sentence)[s:e] == ["brown,"]
    # a marker inside a word covers that whole word
    assert parse_marked("a red**[dish]**es here") == [(1, 2)]


def test_parse_maps_rewritten_reply_onto_sentence():
    sentence = "A big red bird singing in a tree."
    reply = json.dumps({"output": "A **[big red]** bird sings in a tree."})
    assert parse_marked(reply, sentence) == [(1, 3)]
    # a marked segment that the sentence does not contain is dropped
    assert parse_marked("A **[purple]** bird singing in a tree.", "A bird singing in a tree.") == []


def test_iou_by_hand():
    assert span_iou((0, 2), (1, 3)) == pytest.approx(1 / 3)
    assert span_iou((0, 2), (2, 4)) == 0.0
    assert span_iou((1, 4), (1, 4)) == 1.0
    # word sets {0,1,5} and {1,2}: intersection {1}, union {0,1,2,5}
    assert set_iou([(0, 2), (5, 6)], [(1, 3)]) == pytest.approx(1 / 4)
    assert set_iou([], [(1, 3)]) == 0.0


def test_ap_and_miou_by_hand():
    preds = [
        [(0, 2), (5, 6)],  # vs GT (1,3): IoU 1/3 -> hit; (5,6) vs (1,3): 0 -> miss; set IoU 1/4
        [(2, 5)],          # vs GT (2,4),(7,8): IoU with (2,4) = 2/3 -> hit; set IoU {2,3,4} vs {2,3,7} = 2/4
        [],                # no prediction: IoU 0
        [(0, 10)],         # no GT span: sentence skipped
    ]
    gts = [[(1, 3)], [(2, 4), (7, 8)], [(0, 1)], []]
    m = localization_metrics(preds, gts)
    assert m["n_sentences"] == 3 and m["n_pred"] == 3 and m["n_hit"] == 2
    assert m["ap"] == pytest.approx(100 * 2 / 3)
    assert m["miou"] == pytest.approx(100 * (1 / 4 + 2 / 4 + 0) / 3)
    # the 0.3 threshold is inclusive (">= 0.3"): IoU exactly 0.3 counts
    assert localization_metrics([[(0, 3)]], [[(2, 10)]])["ap"] == 0.0  # 1/10
    assert localization_metrics([[(0, 10)]], [[(0, 3)]])["ap"] == 100.0  # 3/10 = 0.3
    assert localization_metrics([[]], [[(0, 1)]])["ap"] != localization_metrics([[]], [[(0, 1)]])["ap"]  # NaN
    with pytest.raises(ValueError, match="^localization: 1 predictions but 0 ground truths$"):
        localization_metrics([[]], [])
