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
from halsift.synth.scene import COLOURS, NUMBER_WORDS, REL_OPPOSITE, SHAPES, Group, relation
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


_PHRASE = rf"((?:a|an|one|two|three) (?:(?:{'|'.join(COLOURS)}) )?(?:{'|'.join(SHAPES)})s?)"
_PARTS = re.compile(rf"^{_PHRASE} {_REL} {_PHRASE}(?:, and {_PHRASE})?\.$", re.IGNORECASE)


def _parts(text: str) -> tuple[list[str], str, list[str], str]:
    """(A's words, relation, B's words, the added object or '') of a compositional caption, lower-cased, with
    the article 'an' read as 'a' (it follows the next word)."""
    m = _PARTS.match(text)
    assert m, text
    a, rel, b, added = ((g or "").lower() for g in m.groups())
    words = lambda p: ["a" if w == "an" else w for w in p.split()]  # noqa: E731
    return words(a), rel, words(b), added


def _differ_in(x: list[str], y: list[str], words) -> bool:
    """x and y are the same phrase but for one word, which is one of ``words`` in both (a colour, a shape)."""
    diff = [(u, v) for u, v in zip(x, y) if u != v]
    stem = lambda w: w.rstrip("s") if w.rstrip("s") in SHAPES else w  # noqa: E731 - plural shapes
    return len(x) == len(y) and len(diff) == 1 and all(stem(w) in words for w in diff[0])


def test_negatives_change_what_the_category_says(world):
    """Each category's negative is its caption with exactly the change the category names (SugarCrepe), for every
    pair: another relation, the objects swapped, an object or attribute added, one word replaced."""
    for cat in CATEGORIES:
        for item in json.loads((world / "compositional" / f"{cat}.json").read_text()).values():
            (a, rel, b, added), (na, nrel, nb, nadded) = _parts(item["caption"]), _parts(item["negative_caption"])
            where = (cat, item["caption"], item["negative_caption"])
            if cat == "replace_rel":
                assert (na, nb, nadded) == (a, b, "") and nrel == REL_OPPOSITE[rel], where
            elif cat == "swap_obj":
                assert (na, nrel, nb, nadded) == (b, rel, a, ""), where
            elif cat == "add_obj":
                assert (na, nrel, nb) == (a, rel, b) and not added and nadded, where
                assert item["negative_caption"] == item["caption"][:-1] + f", and {nadded}.", where
            elif cat == "add_att":
                assert (nrel, nb, nadded) == (rel, b, "") and not any(w in COLOURS for w in a), where
                assert len(na) == len(a) + 1 and na[1] in COLOURS and na[:1] + na[2:] == a, where
            elif cat == "replace_obj":
                assert (nrel, nb, nadded) == (rel, b, "") and _differ_in(a, na, SHAPES), where
            elif cat == "replace_att":
                assert (nrel, nb, nadded) == (rel, b, "") and _differ_in(a, na, COLOURS), where
            elif cat == "swap_att":
                assert nrel == rel and _differ_in(a, na, COLOURS) and _differ_in(b, nb, COLOURS), where
                assert (na[1], nb[1]) == (b[1], a[1]), where  # the two colours exchanged
            else:
                raise AssertionError(f"no check for category {cat}")


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
