"""The world's zero-shot tasks and SugarCrepe hard negatives: exact ground truth from the scene graph, readable by
the eval readers, and the rest of the world unchanged by them."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from halsift.corpus.classification import read_classification
from halsift.corpus.sugarcrepe import CATEGORIES, read_sugarcrepe
from halsift.synth.scene import COLOURS, NUMBER_WORDS, SHAPES, Group, relation
from halsift.synth.world import generate_world
from halsift.synth.zeroshot_tasks import TASKS, zeroshot_scene

_NP = (r"(a|an|one|two|three) (?:(" + "|".join(COLOURS) + r") )?(" + "|".join(SHAPES) + r")s?")
_REL = r"(to the left of|to the right of|above|below)"
_CAPTION = re.compile(rf"^{_NP} {_REL} {_NP}(?:, and {_NP})?\.$", re.IGNORECASE)
_COUNT = {"a": 1, "an": 1, **{w: n for n, w in NUMBER_WORDS.items()}}


def _matches(g: Group, count: str, colour: str | None, shape: str) -> bool:
    return g.shape == shape and (colour is None or g.colour == colour) and g.count == _COUNT[count.lower()]


def caption_true(text: str, scene: dict) -> bool:
    """Whether a compositional caption holds in the scene graph: both noun phrases name groups standing in the
    stated relation (the world's: horizontal first), and an added object exists."""
    m = _CAPTION.match(text)
    assert m, text
    c1, col1, s1, rel, c2, col2, s2, c3, col3, s3 = m.groups()
    groups = [Group(**g) for g in scene["groups"]]
    pair = any(relation(a, b) == rel for a in groups if _matches(a, c1, col1, s1)
               for b in groups if b is not a and _matches(b, c2, col2, s2))
    extra = s3 is None or any(g.shape == s3 and g.colour == col3 for g in groups)
    return pair and extra


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("w")
    generate_world(out, images=30, seed=4, bench_images=4, t2i_prompts=2, retrieval_images=4, pretrain_images=4,
                   zeroshot_images=14, compositional_images=40)
    return out


def test_every_caption_is_true_and_every_negative_false(world):
    pairs = read_sugarcrepe(world / "compositional", world / "compositional" / "images")
    assert list(pairs) == sorted(CATEGORIES)
    raw = {c: json.loads((world / "compositional" / f"{c}.json").read_text()) for c in CATEGORIES}
    for cat in CATEGORIES:
        assert len(pairs[cat]) == (40 if cat != "swap_att" else len(raw[cat])) and len(raw[cat]) >= 30, cat
        for item in raw[cat].values():
            assert caption_true(item["caption"], item["scene"]), (cat, item["caption"])
            assert not caption_true(item["negative_caption"], item["scene"]), (cat, item["negative_caption"])
            assert item["caption"] != item["negative_caption"]


def test_negatives_change_what_the_category_says(world):
    item = {c: json.loads((world / "compositional" / f"{c}.json").read_text())["0"] for c in CATEGORIES}
    pos, rel = item["replace_rel"]["caption"], item["replace_rel"]["negative_caption"]
    assert pos.split()[:3] == rel.split()[:3] and pos != rel  # same objects, another relation
    assert item["add_obj"]["negative_caption"].startswith(item["add_obj"]["caption"][:-1] + ", and ")
    assert sorted(item["swap_obj"]["negative_caption"].lower().split()) != sorted(pos.lower().split()) or \
        item["swap_obj"]["negative_caption"] != pos
    assert len(item["add_att"]["negative_caption"].split()) == len(item["add_att"]["caption"].split()) + 1


@pytest.mark.parametrize("task", sorted(TASKS))
def test_zeroshot_tasks_label_the_main_object(world, task):
    cset = read_classification(world / "zeroshot" / task)
    values, names, templates = TASKS[task]
    assert cset.layout == "wds" and cset.classnames == list(names) and cset.templates == list(templates)
    items = list(cset.iter_items())
    assert len(items) == 14
    for i, (_, _, label) in enumerate(items):
        scene, want, _ = zeroshot_scene(4, task, i)
        g = scene.groups[0]
        assert len(scene.groups) == 1 and label == want
        assert {"shape": g.shape, "colour": g.colour, "count": g.count}[task] == values[label]


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_turning_them_off_leaves_the_rest_of_the_world_byte_identical(world, tmp_path):
    generate_world(tmp_path, images=30, seed=4, bench_images=4, t2i_prompts=2, retrieval_images=4,
                   pretrain_images=4, zeroshot_images=0, compositional_images=0)
    assert not (tmp_path / "zeroshot").exists() and not (tmp_path / "compositional").exists()
    on = {k: v for k, v in _hashes(world).items() if not k.startswith(("zeroshot/", "compositional/"))}
    assert on == _hashes(tmp_path)
