"""Simulated text-to-image generators: a 3-4 sentence prompt (locations and facing directions, like the seeds'
T2I prompts) is rendered by generators that make image-side mistakes; each prompt sentence is labelled by
diffing what it states against the scene that was actually drawn."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from .scene import (CELLS, COLOURS, DIRECTIONS, OPPOSITE, SIGN_WORDS, Group, Scene, background_words,
                    sample_scene)
from .text import DIR_WORDS, Piece, fill, loc, merge_spans, np_indef, words

# mistake -> (hallucination type the prompt sentence gets, tag of the words that become wrong)
MISTAKES = {"count": ("Number", "count"), "extra": ("Number", "count"), "flip": ("Direction", "dir"),
            "missing": ("Object", "np"), "colour": ("Attribute", "colour"), "move": ("Location", "cell"),
            "text": ("Text", "text")}
TYPE_ORDER = ("Object", "Attribute", "Number", "Location", "Direction", "Text", "Relation", "Illusion", "Other")


@dataclass(frozen=True)
class T2IProfile:
    """How often and how one simulated generator departs from its prompt."""

    name: str
    mistake_rate: float  # probability that a prompt sentence is rendered wrong
    mistake_mix: dict[str, float]  # weight per mistake in MISTAKES

    def design(self) -> dict:
        d = asdict(self)
        d["generator_type"] = "t2i"
        return d


T2I_PROFILES: tuple[T2IProfile, ...] = (
    T2IProfile("sd-sim", 0.55, {"count": 3, "extra": 1.5, "missing": 2, "colour": 2, "flip": 1.5, "move": 1.5,
                                "text": 1.5}),
    T2IProfile("gptgen-sim", 0.2, {"flip": 5, "count": 1.5, "extra": 0.5, "colour": 1, "move": 1, "text": 1,
                                   "missing": 0.5}),
    T2IProfile("flux-sim", 0.35, {"flip": 2.5, "count": 2, "extra": 1, "missing": 1, "colour": 1.5, "move": 1,
                                  "text": 1}),
)
T2I_BY_NAME = {p.name: p for p in T2I_PROFILES}

_FILLERS = ("drawn with crisp and clearly defined outlines", "painted in bright and evenly filled colour",
            "standing out boldly against the background", "drawn in a clean flat style")


@dataclass
class PromptSentence:
    """One prompt sentence and what it states: a group (by id), the sign, or the background."""

    text: str
    subject: str  # "group" | "sign" | "background"
    group: Group | None
    spans: dict[str, list[list[int]]]  # tag -> word spans


def make_prompt(scene: Scene, rng: random.Random) -> list[PromptSentence]:
    """3-4 sentences: each group with its location and facing, then the sign or the background."""
    out: list[PromptSentence] = []
    bg = words(background_words(scene), "bg")
    for i, g in enumerate(scene.groups):
        np = np_indef(g, rng)
        np = [(t, "np" if tag == "size" else tag) for t, tag in np]
        verb = words("stands" if g.count == 1 else "stand")
        slots: dict[str, list[Piece]] = {"NP": np, "V": verb, "LOC": loc(g.cell), "BG": bg,
                                         "DIR": words(DIR_WORDS[g.facing], "dir"),
                                         "FILL": words(rng.choice(_FILLERS))}
        if i == 0:
            tpl = "On a {BG} background, {NP} {V} {LOC}, facing {DIR}, {FILL}."
        else:
            tpl = rng.choice(("{LOC}, {NP} {V} facing {DIR}, {FILL}.",
                              "Nearby, {NP} {V} {LOC}, turned to face {DIR} and {FILL}."))
        text, spans = fill(tpl, slots)
        # "np" covers the whole noun phrase (count, size, colour, shape words)
        np_words = [sp for tag in ("count", "np", "colour", "shape") for sp in spans.get(tag, [])]
        spans["np"] = merge_spans(np_words)
        out.append(PromptSentence(text, "group", g, spans))
    if scene.sign is not None:
        text, spans = fill('A small white sign with the word {TEXT} written on it hangs {LOC}.',
                           {"TEXT": words(f'"{scene.sign.text}"', "text"), "LOC": loc(scene.sign.cell)})
        out.append(PromptSentence(text, "sign", None, spans))
    if len(out) < 3:
        text, spans = fill("The whole background is {BG}, evenly lit from one edge of the frame to the other.",
                           {"BG": bg})
        out.append(PromptSentence(text, "background", None, spans))
    return out


def sample_prompt_scene(rng: random.Random) -> Scene:
    """Prompt scenes: 2-3 groups, so that prompts have 3-4 sentences."""
    return sample_scene(rng, n_groups=(2, 3), sign_p=0.5)


def generate(scene: Scene, prompt: list[PromptSentence], profile: T2IProfile, rng: random.Random) -> Scene:
    """The scene a generator actually draws for ``prompt``: the intended one with per-sentence mistakes."""
    drawn = scene.copy()
    for ps in prompt:
        if ps.subject == "background" or rng.random() >= profile.mistake_rate:
            continue
        options = {m: w for m, w in profile.mistake_mix.items() if _applies(m, ps, drawn)}
        if not options:
            continue
        mistake = rng.choices(list(options), weights=list(options.values()))[0]
        _apply(mistake, ps, drawn, rng)
    return drawn


def _applies(mistake: str, ps: PromptSentence, drawn: Scene) -> bool:
    free = [c for c in range(9) if c not in drawn.used_cells()]
    if ps.subject == "sign":
        return mistake in ("text", "move") and bool(free) and drawn.sign is not None
    if mistake == "text":
        return False
    if mistake in ("extra", "move"):
        return bool(free)
    if mistake == "count":
        return ps.group.size == "small"
    return True


def _apply(mistake: str, ps: PromptSentence, drawn: Scene, rng: random.Random) -> None:
    free = [c for c in range(9) if c not in drawn.used_cells()]
    if ps.subject == "sign":
        if mistake == "text":
            drawn.sign.text = rng.choice([w for w in SIGN_WORDS if w != drawn.sign.text])
        else:
            drawn.sign.cell = rng.choice(free)
        return
    idx = next(i for i, h in enumerate(drawn.groups) if h.id == ps.group.id)
    g = drawn.groups[idx]
    if mistake == "count":
        g.count = rng.choice([n for n in (1, 2, 3) if n != g.count])
    elif mistake == "extra":
        drawn.groups.append(Group(g.shape, g.colour, g.size, 1, rng.choice(free), g.facing, id=g.id))
    elif mistake == "flip":
        g.facing = OPPOSITE[g.facing] if rng.random() < 0.7 else rng.choice(
            [d for d in DIRECTIONS if d != g.facing])
    elif mistake == "missing":
        del drawn.groups[idx]
    elif mistake == "colour":
        used = {(h.shape, h.colour) for h in drawn.groups}
        g.colour = rng.choice([c for c in COLOURS if c != g.colour and (g.shape, c) not in used])
    elif mistake == "move":
        g.cell = rng.choice(free)


def label(ps: PromptSentence, drawn: Scene) -> tuple[str, list[str], list[list[int]]]:
    """Label a prompt sentence against the drawn scene: (label, types, spans of the words the image contradicts)."""
    wrong: dict[str, str] = {}  # tag -> type
    if ps.subject == "group":
        g = ps.group
        copies = [h for h in drawn.groups if h.id == g.id]
        if not copies:
            wrong["np"] = "Object"
        else:
            if sum(h.count for h in copies) != g.count:
                wrong["count"] = "Number"
            if copies[0].colour != g.colour:
                wrong["colour"] = "Attribute"
            if copies[0].facing != g.facing:
                wrong["dir"] = "Direction"
            if copies[0].cell != g.cell:
                wrong["cell"] = "Location"
    elif ps.subject == "sign":
        wrong.update(_sign_diff(ps, drawn))
    # generators never change the background, so a background sentence is always correct
    if not wrong:
        return "correct", [], []
    types = sorted(set(wrong.values()), key=TYPE_ORDER.index)
    spans = merge_spans([sp for tag in wrong for sp in ps.spans.get(tag, [])])
    return "incorrect", types, spans


def _sign_diff(ps: PromptSentence, drawn: Scene) -> dict[str, str]:
    words_ = ps.text.split()
    stated_text = words_[ps.spans["text"][0][0]].strip('".')
    if drawn.sign is None:
        return {"text": "Object"}
    out = {}
    if drawn.sign.text != stated_text:
        out["text"] = "Text"
    stated_loc = " ".join(words_[slice(*ps.spans["cell"][0])]).rstrip(".")
    if CELLS[drawn.sign.cell][1] != stated_loc:
        out["cell"] = "Location"
    return out


def t2i_sample(scene: Scene, profile: T2IProfile, rng: random.Random,
               prompt: list[PromptSentence] | None = None) -> tuple[Scene, list[dict]]:
    """Draw ``scene``'s prompt with ``profile``; returns the drawn scene and the labelled prompt sentences."""
    prompt = prompt if prompt is not None else make_prompt(scene, rng)
    drawn = generate(scene, prompt, profile, rng)
    sentences = []
    for pos, ps in enumerate(prompt):
        lab, types, spans = label(ps, drawn)
        sentences.append({"text": ps.text, "position": pos, "label": lab, "types": types, "spans": spans})
    return drawn, sentences


__all__ = ["T2IProfile", "T2I_PROFILES", "T2I_BY_NAME", "make_prompt", "generate", "label", "t2i_sample",
           "sample_prompt_scene"]
