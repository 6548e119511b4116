"""SugarCrepe's seven hard-negative categories from the synthetic world's scene graphs, with exact ground truth.

Per image, two object groups A and B and their relation give the true caption "A REL B" (e.g. "Two red circles to
the left of a blue square."; every noun phrase names one group, as (shape, colour) is unique in a scene), and each
category a negative that the scene graph makes false:

* ``replace_obj``: A's shape -> a shape not in the scene;  ``replace_att``: A's colour -> one no group of A's shape has;
* ``replace_rel``: REL -> its opposite;  ``swap_obj``: "B REL A" (relations are antisymmetric);
* ``swap_att``: A and B swap colours (another pair where A and B share a colour or both swapped objects exist; no
  pair for the image when none can);
* ``add_obj``: "..., and a <colour> <shape>" with a shape not in the scene;
* ``add_att``: true caption "A' REL B" with A's colour left out, negative with a colour no group of A's shape has.

Written in SugarCrepe's format: ``compositional/<category>.json`` (``{id: {filename, caption, negative_caption}}``)
and ``compositional/images/``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from halsift.corpus.sugarcrepe import CATEGORIES
from .render import png_bytes, render
from .scene import COLOURS, NUMBER_WORDS, REL_OPPOSITE, SHAPES, Group, relation, sample_scene
from .text import article


def noun_phrase(g: Group, shape: str | None = None, colour: str | None = "") -> str:
    """'a red circle' / 'two red circles'; ``shape`` / ``colour`` replace the group's (``colour=None``: none said)."""
    colour = g.colour if colour == "" else colour
    noun = (shape or g.shape) + ("s" if g.count > 1 else "")
    words = f"{colour} {noun}" if colour else noun
    return f"{article(words) if g.count == 1 else NUMBER_WORDS[g.count]} {words}"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def hard_negatives(scene, rng: random.Random) -> dict[str, tuple[str, str]]:
    """``{category: (caption, negative_caption)}`` for a scene with >= 2 groups (a category may be left out)."""
    a, b = rng.sample(scene.groups, 2)
    rel = relation(a, b)
    used = {(g.shape, g.colour) for g in scene.groups}
    shapes = {g.shape for g in scene.groups}
    pos = f"{noun_phrase(a)} {rel} {noun_phrase(b)}"
    new_shape = rng.choice([s for s in SHAPES if s not in shapes])
    other_colour = rng.choice([c for c in COLOURS if (a.shape, c) not in used])
    out = {
        "replace_obj": (pos, f"{noun_phrase(a, shape=new_shape)} {rel} {noun_phrase(b)}"),
        "replace_att": (pos, f"{noun_phrase(a, colour=other_colour)} {rel} {noun_phrase(b)}"),
        "replace_rel": (pos, f"{noun_phrase(a)} {REL_OPPOSITE[rel]} {noun_phrase(b)}"),
        "swap_obj": (pos, f"{noun_phrase(b)} {rel} {noun_phrase(a)}"),
        "add_obj": (pos, f"{pos}, and {article(new_shape)} {rng.choice(list(COLOURS))} {new_shape}"),
        "add_att": (f"{noun_phrase(a, colour=None)} {rel} {noun_phrase(b)}",
                    f"{noun_phrase(a, colour=other_colour)} {rel} {noun_phrase(b)}"),
    }
    swappable = [(x, y) for x in scene.groups for y in scene.groups if x is not y and x.colour != y.colour
                 and not ((x.shape, y.colour) in used and (y.shape, x.colour) in used)]
    if swappable:  # A and B when they can swap colours, else another pair that can
        x, y = (a, b) if (a, b) in swappable else rng.choice(swappable)
        r = relation(x, y)
        out["swap_att"] = (f"{noun_phrase(x)} {r} {noun_phrase(y)}",
                           f"{noun_phrase(x, colour=y.colour)} {r} {noun_phrase(y, colour=x.colour)}")
    return {cat: (_sentence(p), _sentence(n)) for cat, (p, n) in out.items()}


def write_compositional(out: Path, seed: int, n: int, image_size: int, bar=None) -> dict[str, int]:
    """Write ``n`` images and the seven category files under ``out``; returns pairs per category."""
    (out / "images").mkdir(parents=True, exist_ok=True)
    cats: dict[str, dict] = {c: {} for c in CATEGORIES}
    for i in range(n):
        rng = random.Random(f"{seed}/compositional/{i}")
        scene = sample_scene(rng)
        name = f"s{i:06d}.png"
        (out / "images" / name).write_bytes(png_bytes(render(scene, image_size, seed=rng.randrange(2**31))))
        for cat, (pos, neg) in hard_negatives(scene, rng).items():
            cats[cat][str(i)] = {"filename": name, "caption": pos, "negative_caption": neg,
                                 "scene": scene.to_json()}
        if bar is not None:
            bar.update()
    for cat, items in cats.items():
        (out / f"{cat}.json").write_text(json.dumps(items, sort_keys=True) + "\n", encoding="utf-8")
    return {cat: len(items) for cat, items in cats.items()}
