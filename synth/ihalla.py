"""I-HallA on the synthetic world: QA sets generated from the text-to-image prompts' scene graphs, and an oracle
answerer that reads the scene each simulated generator actually drew.

Every question is fully determined by its text (it names the object by the attributes it states), so the oracle
maps a question's text back to a *probe* (what to look up in a scene) and answers from the drawn scene graph: the
choice whose text equals the drawn value, or E ("None of the above") when no choice does. A perfect drawing
therefore scores 1.0 and every image-side mistake the generator made can cost answers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .scene import (BACKGROUNDS, CELLS, COLOURS, DIRECTIONS, NUMBER_WORDS, PATTERNS, SHAPES,
                                  SIGN_WORDS, Scene, background_words, relation)
from .t2i import T2I_PROFILES, T2IProfile, make_prompt, sample_prompt_scene, t2i_sample
from halsift.eval.metrics.ihalla import LETTERS, NONE_CHOICE, PromptQA, QAItem
from halsift.eval.runs.ihalla import IhallaAnswers, answer_with

COI_OF = {"colour": "color", "count": "counting", "exists": "existence", "facing": "posture", "where": "relation",
          "relation": "relation", "size": "size", "shape": "shape", "sign_text": "existence",
          "sign_where": "relation", "scene": "scene"}
_RELS = ("to the left of", "to the right of", "above", "below")
_SIZES = ("small", "large", "medium-sized", "huge")
_BG_OPTIONS = ([f"plain {b}" for b in BACKGROUNDS] + [f"{p} {b}" for p in PATTERNS for b in BACKGROUNDS]
               + ["painted gradient", "text-covered"])


@dataclass
class SynthImage:
    """A generated image of the synthetic world: its id and the scene graph that was drawn (pixels on demand)."""

    id: str
    scene: Scene
    seed: int = 0
    size: int = 64
    _img: Any = field(default=None, repr=False)

    @property
    def image(self):
        """The rendered PIL image (for answerers that look at pixels)."""
        if self._img is None:
            from .render import render

            self._img = render(self.scene, self.size, seed=self.seed)
        return self._img


def _where(cell: int) -> str:
    return " ".join(CELLS[cell])


def _value(probe: dict, scene: Scene) -> str | None:
    """What ``scene`` says for ``probe`` (None when the probed object is not there)."""
    k = probe["kind"]
    if k == "scene":
        return background_words(scene)
    if k in ("sign_text", "sign_where"):
        if scene.sign is None:
            return None
        return scene.sign.text if k == "sign_text" else CELLS[scene.sign.cell][1]
    if k == "exists":
        hits = [g for g in scene.groups if g.cell == probe["cell"]]
        return f"a {hits[0].colour} {hits[0].shape}" if hits else None
    if k == "colour":
        hits = [g for g in scene.groups if g.shape == probe["shape"] and g.cell == probe["cell"]]
        return hits[0].colour if hits else None
    if k == "shape":
        hits = [g for g in scene.groups if g.colour == probe["colour"] and g.cell == probe["cell"]]
        return hits[0].shape if hits else None
    if k == "count":
        n = sum(g.count for g in scene.groups if g.shape == probe["shape"] and g.colour == probe["colour"])
        return NUMBER_WORDS[n] if n else None
    if k == "relation":
        a = [g for g in scene.groups if (g.shape, g.colour) == tuple(probe["a"])]
        b = [g for g in scene.groups if (g.shape, g.colour) == tuple(probe["b"])]
        return relation(a[0], b[0]) if a and b and a[0].cell != b[0].cell else None
    hits = [g for g in scene.groups if g.shape == probe["shape"] and g.colour == probe["colour"]]
    if not hits:
        return None
    g = hits[0]
    return {"facing": g.facing, "where": CELLS[g.cell][1], "size": g.size}[k]


def _text_and_pool(probe: dict, scene: Scene) -> tuple[str, Sequence[str]]:
    k = probe["kind"]
    if k == "scene":
        return "What does the background of the image look like?", _BG_OPTIONS
    if k == "sign_text":
        return "What word is written on the sign in the image?", SIGN_WORDS
    if k == "sign_where":
        return "Where is the sign in the image?", [c[1] for c in CELLS]
    if k == "exists":
        return (f"Which object is {_where(probe['cell'])} of the image?",
                [f"a {c} {s}" for s in SHAPES for c in COLOURS])
    if k == "colour":
        return f"What colour is the {probe['shape']} {_where(probe['cell'])}?", list(COLOURS)
    if k == "shape":
        return f"What shape is the {probe['colour']} object {_where(probe['cell'])}?", SHAPES
    if k == "relation":
        (sa, ca), (sb, cb) = probe["a"], probe["b"]
        return f"Where is the {ca} {sa} relative to the {cb} {sb}?", _RELS
    obj = f"the {probe['colour']} {probe['shape']}"
    if k == "count":
        return f"How many {probe['colour']} {probe['shape']}s are in the image?", [NUMBER_WORDS[n] for n in range(1, 6)]
    if k == "facing":
        return f"Which way is {obj} facing?", DIRECTIONS
    if k == "where":
        return f"Where in the image is {obj}?", [c[1] for c in CELLS]
    return f"How big is {obj}?", _SIZES


def _candidates(scene: Scene, rng: random.Random) -> list[dict]:
    """Probes about the intended scene, one or two per prompt sentence first, then relations and the background."""
    first, rest = [], []
    for g in scene.groups:
        kinds = ["colour", "count", "exists", "facing", "where", "shape", "size"]
        rng.shuffle(kinds)
        for i, k in enumerate(kinds):
            p = {"kind": k}
            if k in ("colour",):
                p.update(shape=g.shape, cell=g.cell)
            elif k == "shape":
                p.update(colour=g.colour, cell=g.cell)
            elif k == "exists":
                p.update(cell=g.cell)
            else:
                p.update(shape=g.shape, colour=g.colour)
            (first if i == 0 else rest).append(p)
    if scene.sign is not None:
        k = rng.choice(("sign_text", "sign_where"))
        first.append({"kind": k})
        rest.append({"kind": "sign_where" if k == "sign_text" else "sign_text"})
    gs = scene.groups
    for i in range(len(gs)):
        for j in range(i + 1, len(gs)):
            rest.append({"kind": "relation", "a": [gs[i].shape, gs[i].colour], "b": [gs[j].shape, gs[j].colour]})
    rest.append({"kind": "scene"})
    rng.shuffle(rest)
    return first + rest


def make_qa(prompt_id: str, prompt: str, scene: Scene, rng: random.Random, n_questions: int = 5) -> PromptQA:
    """Five (``n_questions``) multiple-choice questions about the scene a prompt describes; gold = the prompt's truth."""
    qa = PromptQA(prompt_id, prompt, scene.domain)
    seen: set[str] = set()
    for probe in _candidates(scene, rng):
        if len(qa.items) == n_questions:
            break
        text, pool = _text_and_pool(probe, scene)
        gold = _value(probe, scene)
        if gold is None or text in seen:
            continue
        seen.add(text)
        options = rng.sample([o for o in pool if o != gold], 3) + [gold]
        rng.shuffle(options)
        qa.items.append(QAItem(prompt_id, len(qa.items), text, tuple(options) + (NONE_CHOICE,),
                               LETTERS[options.index(gold)], COI_OF[probe["kind"]]))
        _PROBES[text] = probe
    return qa


_PROBES: dict[str, dict] = {}  # question text -> probe (the text determines the probe, so this is a pure cache)


class SceneOracle:
    """:class:`VqaAnswerer` for :class:`SynthImage`: answers from the drawn scene graph (never fails to parse)."""

    def answer(self, image: SynthImage, question: str, choices: Sequence[str]) -> tuple[str | None, bool]:
        probe = _PROBES.get(question)
        if probe is None:
            raise KeyError(f"SceneOracle: unknown question {question!r} (only synthetic QA sets can be answered)")
        v = _value(probe, image.scene)
        low = [c.lower() for c in choices[:4]]
        return (LETTERS[low.index(v.lower())] if v is not None and v.lower() in low else "E"), True


@dataclass
class SynthIHallA:
    """A synthetic I-HallA benchmark: QA sets, each generator's drawn images, per-image reference judgments and
    each generator's true error rate (share of prompt sentences its images contradict)."""

    qa_sets: list[PromptQA]
    images: dict[str, dict[str, SynthImage]]
    reference: pd.DataFrame  # generator, prompt_id, reference (= 1 - share of contradicted prompt sentences)
    true_error: dict[str, float]
    designed: dict[str, float]


# extra generators widen the range of error rates beyond the world's three (used by tests and --synthetic)
EXTRA_PROFILES = (
    T2IProfile("careful-sim", 0.08, {"flip": 1, "count": 1, "colour": 1, "move": 1, "missing": 1, "text": 1}),
    T2IProfile("sloppy-sim", 0.75, {"count": 2, "extra": 1, "missing": 2, "colour": 2, "flip": 2, "move": 2,
                                    "text": 1}),
)


def synthetic_ihalla(n_prompts: int = 40, seed: int = 0,
                     profiles: Sequence[T2IProfile] = T2I_PROFILES + EXTRA_PROFILES,
                     image_size: int = 64) -> SynthIHallA:
    """Deterministic QA sets for ``n_prompts`` t2i prompts, each drawn by every profile (no pixels rendered here)."""
    if n_prompts < 1:
        raise ValueError(f"n_prompts must be >= 1, got {n_prompts}")
    qa_sets, ref_rows = [], []
    images: dict[str, dict[str, SynthImage]] = {p.name: {} for p in profiles}
    wrong = {p.name: 0 for p in profiles}
    total = {p.name: 0 for p in profiles}
    for i in range(n_prompts):
        rng = random.Random(f"{seed}/ihalla/{i}")
        scene = sample_prompt_scene(rng)
        prompt = make_prompt(scene, rng)
        pid = f"p{i:05d}"
        qa_sets.append(make_qa(pid, " ".join(s.text for s in prompt), scene, rng))
        for prof in profiles:
            grng = random.Random(f"{seed}/ihalla/{i}/{prof.name}")
            drawn, sents = t2i_sample(scene, prof, grng, prompt)
            images[prof.name][pid] = SynthImage(f"{pid}-{prof.name}", drawn, grng.randrange(2**31), image_size)
            bad = sum(s["label"] == "incorrect" for s in sents)
            wrong[prof.name] += bad
            total[prof.name] += len(sents)
            ref_rows.append({"generator": prof.name, "prompt_id": pid, "reference": 1.0 - bad / len(sents)})
    return SynthIHallA(qa_sets, images, pd.DataFrame(ref_rows),
                       {g: wrong[g] / total[g] for g in wrong}, {p.name: p.mistake_rate for p in profiles})


def synthetic_answers(cfg) -> IhallaAnswers:
    """The synthetic I-HallA benchmark of ``cfg`` (an :class:`~halsift.eval.runs.ihalla.IhallaEvalConfig` with
    ``synthetic``) answered by the scene oracle or ``cfg.answerer``, as :func:`~halsift.eval.runs.ihalla.run_ihalla`
    reads it."""
    data = synthetic_ihalla(cfg.prompts, cfg.seed)
    answers, who = answer_with(cfg, data.qa_sets, data.images, SceneOracle())
    return IhallaAnswers(answers, data.reference, data.true_error,
                         f"synthetic world (seed {cfg.seed}, {cfg.prompts} prompts, {who})")


__all__ = ["SynthImage", "SceneOracle", "SynthIHallA", "make_qa", "synthetic_ihalla", "synthetic_answers",
           "EXTRA_PROFILES", "COI_OF"]
