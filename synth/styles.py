"""Caption styles that are not a captioner's: web alt-text (what a web-trained CLIP learns from) and short
human-written captions (what a retrieval benchmark asks with).

They set up HalDec Table F in miniature. The base CLIP is pre-trained on ``alt_text``: short, partial and
loosely paired, it names a shape or two by colour and never says where they are, how many there are, which way
they face or how they relate, so the detailed synthetic captions carry information the base model lacks, and
hallucinated sentences corrupt exactly that information. Retrieval asks with ``human_caption``: one plain
sentence in a syntax of its own (no captioner's template), naming two groups with their counts and places, over
``scene_family`` look-alikes that share their shapes and colours, so only that information tells them apart.
"""

from __future__ import annotations

import random

from .scene import CELLS, COLOURS, DIRECTIONS, NUMBER_WORDS, SHAPES, SIZES, Group, Scene, relation

ALT_TEMPLATES = ("{A}", "{A} and {B}", "{A}, {B}", "picture of {A}", "{A} clipart", "{A} with {B}",
                 "shapes: {A}, {B}", "{A} on {BG}", "{A} {B} drawing")
BG_WORDS = {"plain": "plain background", "patterned": "patterned background", "illustration": "painted background",
            "text-heavy": "text background"}
PLACE = {c: f"{prep} {words}" for c, (prep, words) in enumerate(CELLS)}  # 'in the top left corner', ...
RETRIEVAL_STYLES = ("captioners", "human")  # retrieval captions: by held-out captioners | human_caption


def alt_text(scene: Scene, rng: random.Random, *, noise: float = 0.25) -> str:
    """Web alt-text for ``scene``: one or two shapes by colour and name only, sometimes one that is not there.

    ``noise`` is the chance that one named shape is replaced by a (shape, colour) absent from the scene: web pairs
    are loosely aligned. Counts, sizes, places, facing and relations are never stated.
    """
    shown = rng.sample(scene.groups, min(len(scene.groups), rng.choice((1, 2, 2))))
    names = [f"{g.colour} {g.shape}" for g in shown]
    if rng.random() < noise:
        used = {(g.shape, g.colour) for g in scene.groups}
        shape, colour = rng.choice([(s, c) for s in SHAPES for c in COLOURS if (s, c) not in used])
        names[rng.randrange(len(names))] = f"{colour} {shape}"
    if scene.sign is not None and rng.random() < 0.3:
        names.append(f"{scene.sign.text} sign")
    tpl = rng.choice([t for t in ALT_TEMPLATES if ("{B}" in t) == (len(names) > 1)])
    return tpl.format(A=names[0], B=" ".join(names[1:]), BG=BG_WORDS[scene.domain])


def _np(g: Group) -> str:
    """'two small blue circles' / 'one large red star': count, size, colour, shape, always stated."""
    shape = g.shape + ("s" if g.count > 1 else "")
    return f"{NUMBER_WORDS[g.count]} {g.size} {g.colour} {shape}"


def human_caption(scene: Scene, rng: random.Random) -> str:
    """One plain sentence naming two groups with their counts and places (or a relation between them)."""
    a, b = rng.sample(scene.groups, 2)
    form = rng.randrange(4)
    if form == 0:
        return f"{_np(a).capitalize()} {PLACE[a.cell]} and {_np(b)} {PLACE[b.cell]}."
    if form == 1:
        return f"There {'is' if a.count == 1 else 'are'} {_np(a)} {PLACE[a.cell]}, with {_np(b)} {PLACE[b.cell]}."
    if form == 2:
        return f"{PLACE[a.cell].capitalize()} {_np(a)}, {PLACE[b.cell]} {_np(b)}."
    return f"{_np(a).capitalize()} {PLACE[a.cell]} and {_np(b)} {relation(b, a)} {'it' if a.count == 1 else 'them'}."


def scene_family(base: Scene, rng: random.Random) -> Scene:
    """A look-alike of ``base``: the same shapes, colours, background and sign word, with every group moved to a
    new cell and given a new size, count and facing (the sign moves too)."""
    s = base.copy()
    cells = rng.sample(range(9), len(s.groups) + 1)
    for g, cell in zip(s.groups, cells):
        g.cell = cell
        g.size = rng.choice(SIZES)
        g.count = 1 if g.size == "large" else rng.choice((1, 2, 3))
        g.facing = rng.choice(DIRECTIONS)
    if s.sign is not None:
        s.sign.cell = cells[-1]
    return s
