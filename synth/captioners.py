"""Simulated image-to-text captioners: scene graph -> multi-sentence caption with per-sentence ground truth.

Each profile has a style (sentences per caption, templates, vocabulary, filler clauses) and a hallucination
profile: a designed incorrect rate (over correct + incorrect sentences, as the seeds' Table 1 counts it), a rate
of *unknown* non-visual claims, a mix over the nine hallucination types, and a position profile (the first
sentence is rarely wrong, sentences 2-4 most often; AlignBench Fig. 4 / Fig. E). For each sentence the label and
type are drawn first, then a sentence kind that can carry that type is written with the wrong value, so the
realised rates match the design. Wrong words are tagged while the sentence is built, which gives the spans.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from .scene import (COLOURS, DIRECTIONS, NUMBER_WORDS, REL_OPPOSITE, SHAPES, SIGN_WORDS, Group, Scene,
                    background_words, relation, wrong_background_words)
from .text import DIR_WORDS, Piece, fill, loc, merge_spans, np_def, np_indef, words

TYPES = ("Object", "Attribute", "Number", "Location", "Direction", "Text", "Relation", "Illusion", "Other")
# Illustration and text-heavy images draw more errors (AlignBench Fig. D); the factors average 1 over domains.
DOMAIN_FACTOR = {"plain": 0.85, "patterned": 0.95, "illustration": 1.1, "text-heavy": 1.1}
BASE_POSITIONS = (0.3, 1.3, 1.4, 1.3, 1.05, 0.95, 0.8, 0.75)  # multiplier by 0-based position; last repeats
UNKNOWN_CLAIMS = (
    "The air around the shapes probably smells of fresh paint.",
    "The scene seems to carry a calm and cheerful mood.",
    "It feels like a quiet Sunday afternoon in this picture.",
    "Whoever drew this was probably in a playful mood.",
    "A gentle breeze seems to be blowing through the scene.",
    "The shapes look as if they are humming a quiet tune.",
    "The picture was probably made for a children's book.",
)
OPENERS = ("In this image,", "Looking at the picture,", "Notably,", "It is worth noting that",
           "On closer inspection,", "As for the details,")
FILLERS = (", clearly visible in the image", ", standing out against the background",
           ", drawn with crisp clean edges", ", which catches the eye at once", ", easy to spot at a glance")


@dataclass(frozen=True)
class CaptionerProfile:
    """Style and hallucination design of one simulated captioner."""

    name: str
    incorrect_rate: float  # designed share of incorrect among correct + incorrect sentences
    unknown_rate: float  # share of non-visual (unknown) sentences after the first
    type_mix: dict[str, float]  # weight per hallucination type (all nine)
    sentences: tuple[int, int]  # min, max sentences per caption
    style: int = 0  # template family
    fancy: float = 0.0  # probability of a rarer synonym for colour / shape words
    filler: float = 0.0  # probability of a trailing descriptive clause
    with_size: float = 1.0  # probability of stating the size
    opener: float = 0.0  # probability of a leading discourse phrase ("In this image, ...")
    positions: tuple[float, ...] = BASE_POSITIONS
    kind_weights: dict[str, float] = field(default_factory=lambda: {
        "describe": 4, "facing": 2, "relation": 1.5, "sign": 1, "background": 0.7, "total": 0.5})

    def design(self) -> dict:
        """The designed rates, as written to world.json."""
        d = asdict(self)
        d["type_mix"] = normalise(self.type_mix)
        d["generator_type"] = "i2t"
        d["position_rates"] = [round(self.position_rate(p), 4) for p in range(self.sentences[1])]
        return d

    def _norm(self) -> float:
        # choose c so that E[#incorrect] / E[#not unknown] == incorrect_rate, given the sentence-count law
        lo, hi = self.sentences
        num = den = 0.0
        for p in range(hi):
            w = (hi - max(p, lo - 1)) / (hi - lo + 1) if p >= lo else 1.0  # P(caption has > p sentences)
            keep = w * (1.0 if p == 0 else 1.0 - self.unknown_rate)
            num += keep * self.mult(p)
            den += keep
        return num / den

    def mult(self, p: int) -> float:
        return self.positions[min(p, len(self.positions) - 1)]

    def position_rate(self, p: int) -> float:
        """Designed incorrect probability (given not unknown) at 0-based position ``p``."""
        return min(1.0, self.incorrect_rate * self.mult(p) / self._norm())


def normalise(mix: dict[str, float]) -> dict[str, float]:
    total = sum(mix.values())
    return {t: round(mix.get(t, 0.0) / total, 6) for t in TYPES}


def _mix(**kw: float) -> dict[str, float]:
    base = dict(Object=12, Attribute=24, Number=10, Location=10, Direction=8, Text=14, Relation=8, Illusion=9,
                Other=5)
    base.update(kw)
    return base


PROFILES: tuple[CaptionerProfile, ...] = (
    CaptionerProfile("gpt-sim", 0.05, 0.03, _mix(Attribute=30, Text=18), (5, 8), style=1, fancy=0.1, filler=0.3,
                     opener=0.15),
    CaptionerProfile("cog-sim", 0.08, 0.01, _mix(Number=18, Object=16), (2, 5), style=0, with_size=0.5),  # terse
    CaptionerProfile("qwen-sim", 0.11, 0.03, _mix(Text=22), (6, 10), style=2, filler=0.2, opener=0.2),
    CaptionerProfile("llama-sim", 0.15, 0.04, _mix(Direction=14, Relation=12), (6, 9), style=1, fancy=0.25,
                     filler=0.5, opener=0.4),
    CaptionerProfile("llava-sim", 0.22, 0.05, _mix(Illusion=16, Location=14), (5, 9), style=2, filler=0.15),
    CaptionerProfile("share-sim", 0.35, 0.06, _mix(Attribute=28, Illusion=14, Other=8), (7, 11), style=0,
                     fancy=0.35, filler=0.7, opener=0.6),
)
PROFILE_BY_NAME = {p.name: p for p in PROFILES}


def check_captioner_names(names, where: str = "captioners") -> None:
    """Raise ``ValueError`` naming ``where`` and the first name that is not a profile of :data:`PROFILES`."""
    unknown = [c for c in names if c not in PROFILE_BY_NAME]
    if unknown:
        raise ValueError(f"{where}: unknown {unknown[0]!r}; expected some of {sorted(PROFILE_BY_NAME)}")

# kinds that can carry each hallucination type (the first sentence may also be the overview)
HOSTS = {"Object": ("describe", "facing"), "Attribute": ("describe", "facing"), "Number": ("describe", "total"),
         "Location": ("describe", "sign"), "Direction": ("facing",), "Text": ("sign",), "Relation": ("relation",),
         "Illusion": ("illusion",), "Other": ("background",)}
OVERVIEW_TYPES = ("Object", "Attribute", "Number")

TEMPLATES = {  # kind -> template families (style index modulo the list)
    "overview": ["The image shows {LIST} on a {BG} background.", "A {BG} scene with {LIST}.",
                 "This picture contains {LIST}, set against a {BG} background."],
    "describe": ["{NP} {BE} {LOC}{FILL}.", "{LOC}, there {BE} {NP}{FILL}.", "{NP} can be seen {LOC}{FILL}."],
    "facing": ["{DNP} {BE} facing {DIR}{FILL}.", "{DNP} {BE} turned to face {DIR}{FILL}.",
               "{DNP} {BE} oriented so that {PRON} {FACE} {DIR}{FILL}."],
    "relation": ["{DNP} {BE} {REL} {DNP2}.", "{DNP} {BE} positioned {REL} {DNP2}{FILL}.",
                 "Looking closer, {DNP} {BE} {REL} {DNP2}."],
    "sign": ["A sign {LOC} reads {TEXT}.", "There is a small sign {LOC} with the word {TEXT} on it.",
             "A white sign bearing the word {TEXT} is placed {LOC}."],
    "background": ["The background is {BG}.", "Everything sits on a {BG} background.",
                   "Behind the shapes, the background is {BG}."],
    "total": ["In total, there are {N} shapes in the image.", "Altogether the picture holds {N} shapes.",
              "Counting every piece, there are {N} shapes in view."],
    "illusion": ["There is also {NP} {LOC}.", "{LOC}, {NP} can also be seen.", "Additionally, {NP} appears {LOC}."],
}


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    keys = list(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys])[0]


def _other(rng: random.Random, options, right):
    return rng.choice([o for o in options if o != right])


SENTENCE_KINDS = ("overview", "describe", "facing", "relation", "sign", "background", "total", "illusion")


class _Writer:
    """Writes one sentence of a kind, optionally with one hallucination of a type."""

    def __init__(self, scene: Scene, profile: CaptionerProfile, rng: random.Random) -> None:
        self.s, self.p, self.rng = scene, profile, rng
        self._queue: list[Group] = []

    def next_group(self) -> Group:
        """Cycle through the groups in a random order, so a caption covers the scene before repeating."""
        if not self._queue:
            self._queue = self.rng.sample(self.s.groups, len(self.s.groups))
        return self._queue.pop()

    def template(self, kind: str) -> str:
        options = TEMPLATES[kind]
        # mostly the profile's own family, sometimes a neighbour: distinct but not robotic
        k = self.p.style if self.rng.random() < 0.75 else self.rng.randrange(len(options))
        return options[k % len(options)]

    def fill_(self) -> list[Piece]:
        return words(self.rng.choice(FILLERS)) if self.rng.random() < self.p.filler else []

    def mutate(self, g: Group, wtype: str | None) -> tuple[Group, set[str]]:
        """A copy of ``g`` as the caption states it, and the tags of the words that are wrong."""
        rng, used = self.rng, {(h.shape, h.colour) for h in self.s.groups}
        h = Group(**{**g.__dict__})
        if wtype == "Object":
            h.shape = rng.choice([s for s in SHAPES if s != g.shape and (s, g.colour) not in used])
            return h, {"shape"}
        if wtype == "Attribute":
            if rng.random() < 0.75:
                h.colour = rng.choice([c for c in COLOURS if c != g.colour and (g.shape, c) not in used])
                return h, {"colour"}
            h.size = "small" if g.size == "large" else "large"
            return h, {"size"}
        if wtype == "Number":
            h.count = rng.choice([n for n in (1, 2, 3, 4) if n != g.count])
            return h, {"count"}
        return h, set()

    def sentence(self, kind: str, wtype: str | None) -> tuple[str, list[list[int]]]:
        rng, p = self.rng, self.p
        slots: dict[str, list[Piece]] = {"FILL": self.fill_()}
        g = self.next_group()
        fill_slots = getattr(self, f"_slots_{kind}", None) if kind in SENTENCE_KINDS else None
        if fill_slots is None:
            raise ValueError(f"unknown sentence kind {kind!r}")
        fill_slots(g, wtype, slots)
        tpl = self.template(kind)
        if kind != "overview" and rng.random() < p.opener:
            slots["OPEN"] = words(rng.choice(OPENERS))
            tpl = "{OPEN} " + tpl[:1].lower() + tpl[1:]
        text, spans = fill(tpl, slots)
        wrong = merge_spans([sp for tag, ss in spans.items() if tag.endswith("!") for sp in ss])
        return text, wrong

    def _slots_overview(self, g: Group, wtype: str | None, slots: dict[str, list[Piece]]) -> None:
        rng, s, p = self.rng, self.s, self.p
        shown = s.groups[:3]
        wrong_i = rng.randrange(len(shown)) if wtype else -1
        pieces: list[Piece] = []
        for i, gi in enumerate(shown):
            h, wrong = self.mutate(gi, wtype) if i == wrong_i else (gi, set())
            if i == len(shown) - 1 and i:
                pieces.append(("and", None))
            elif i:
                pieces[-1] = (pieces[-1][0] + ",", pieces[-1][1])
            pieces += np_indef(h, rng, fancy=p.fancy, with_size=wtype == "Attribute" and i == wrong_i
                               or rng.random() < p.with_size * 0.5, wrong=wrong)
        slots["LIST"] = pieces
        slots["BG"] = words(background_words(s))

    def _slots_describe(self, g: Group, wtype: str | None, slots: dict[str, list[Piece]]) -> None:
        rng, s, p = self.rng, self.s, self.p
        h, wrong = self.mutate(g, wtype)
        cell = g.cell
        if wtype == "Location":
            cell = rng.choice([c for c in range(9) if c != g.cell and c not in s.used_cells()] or
                              [c for c in range(9) if c != g.cell])
            wrong = {"cell"}
        slots["NP"] = np_indef(h, rng, fancy=p.fancy, with_size=wtype == "Attribute" or
                               rng.random() < p.with_size, wrong=wrong)
        slots["BE"] = words("is" if h.count == 1 else "are")
        slots["LOC"] = loc(cell, "cell!" if wtype == "Location" else "cell")

    def _slots_facing(self, g: Group, wtype: str | None, slots: dict[str, list[Piece]]) -> None:
        rng, s, p = self.rng, self.s, self.p
        h, wrong = self.mutate(g, wtype if wtype in ("Object", "Attribute") else None)
        if wtype == "Attribute" and "size" in wrong:  # a definite NP states no size: use the colour
            h, wrong = Group(**{**g.__dict__}), {"colour"}
            used = {(x.shape, x.colour) for x in s.groups}
            h.colour = rng.choice([c for c in COLOURS if c != g.colour and (g.shape, c) not in used])
        facing = _other(rng, DIRECTIONS, g.facing) if wtype == "Direction" else g.facing
        slots["DNP"] = np_def(h, rng, fancy=p.fancy, wrong=wrong)
        slots["BE"] = words("is" if h.count == 1 else "are")
        slots["PRON"] = words("it" if h.count == 1 else "they")
        slots["FACE"] = words("faces" if h.count == 1 else "face")
        slots["DIR"] = words(DIR_WORDS[facing], "dir!" if wtype == "Direction" else "dir")

    def _slots_relation(self, g: Group, wtype: str | None, slots: dict[str, list[Piece]]) -> None:
        rng, s, p = self.rng, self.s, self.p
        a = g
        b = rng.choice([x for x in s.groups if x is not g])
        rel = relation(a, b)
        if wtype == "Relation":
            rel = REL_OPPOSITE[rel]
        slots["DNP"] = np_def(a, rng, fancy=p.fancy)
        slots["DNP2"] = np_def(b, rng, fancy=p.fancy)
        slots["BE"] = words("is" if a.count == 1 else "are")
        slots["REL"] = words(rel, "rel!" if wtype == "Relation" else "rel")

    def _slots_sign(self, g: Group, wtype: str | None, slots: dict[str, list[Piece]]) -> None:
        rng, s = self.rng, self.s
        sign = s.sign
        if sign is None:  # a Text hallucination may claim a sign that is not there
            free = [c for c in range(9) if c not in s.used_cells()]
            text, cell = rng.choice(SIGN_WORDS), rng.choice(free)
        else:
            text, cell = sign.text, sign.cell
        if wtype == "Text" and sign is not None:
            text = _other(rng, SIGN_WORDS, sign.text)
        if wtype == "Location":
            cell = rng.choice([c for c in range(9) if c != cell])
        slots["TEXT"] = words(f'"{text}"', "text!" if wtype == "Text" else "text")
        slots["LOC"] = loc(cell, "cell!" if wtype == "Location" else "cell")

    def _slots_background(self, g: Group, wtype: str | None, slots: dict[str, list[Piece]]) -> None:
        rng, s = self.rng, self.s
        bg = wrong_background_words(s, rng) if wtype == "Other" else background_words(s)
        slots["BG"] = words(bg, "bg!" if wtype == "Other" else "bg")

    def _slots_total(self, g: Group, wtype: str | None, slots: dict[str, list[Piece]]) -> None:
        rng, s = self.rng, self.s
        n = s.n_shapes
        if wtype == "Number":
            n = rng.choice([k for k in range(max(2, n - 2), n + 3) if k != n])
        slots["N"] = words(NUMBER_WORDS.get(n, str(n)), "count!" if wtype == "Number" else "count")

    def _slots_illusion(self, g: Group, wtype: str | None, slots: dict[str, list[Piece]]) -> None:
        rng, s, p = self.rng, self.s, self.p
        used = {(x.shape, x.colour) for x in s.groups}
        shape, colour = rng.choice([(a, b) for a in SHAPES for b in COLOURS if (a, b) not in used])
        free = [c for c in range(9) if c not in s.used_cells()]
        h = Group(shape, colour, rng.choice(("small", "large")), 1, rng.choice(free), "left")
        slots["NP"] = [(t, "obj!") for t, _ in np_indef(h, rng, fancy=p.fancy, with_size=rng.random() < 0.5)]
        slots["LOC"] = loc(h.cell)


def caption(scene: Scene, profile: CaptionerProfile, rng: random.Random, *, clean: bool = False,
            max_sentences: int | None = None) -> list[dict]:
    """Sentences of one caption: ``{"text", "position", "label", "types", "spans"}`` each.

    ``clean=True`` writes only correct sentences (pre-training pairs, retrieval captions).
    """
    lo, hi = profile.sentences
    n = rng.randint(lo, hi)
    if max_sentences is not None:
        n = min(n, max_sentences)
    writer = _Writer(scene, profile, rng)
    factor = DOMAIN_FACTOR.get(scene.domain, 1.0)
    kinds = dict(profile.kind_weights)
    if scene.sign is None:
        kinds.pop("sign", None)
    out = []
    for pos in range(n):
        label, wtype = "correct", None
        if not clean:
            if pos > 0 and rng.random() < profile.unknown_rate:
                label = "unknown"
            elif rng.random() < min(1.0, profile.position_rate(pos) * factor):
                label, wtype = "incorrect", _pick(rng, profile.type_mix)
        if label == "unknown":
            text, spans = _unknown(scene, rng), []
        else:
            if wtype is None:
                kind = "overview" if pos == 0 else _pick(rng, kinds)
            elif pos == 0 and wtype in OVERVIEW_TYPES:
                kind = "overview"
            else:
                kind = rng.choice(HOSTS[wtype])
                if kind == "sign" and scene.sign is None and wtype == "Location":
                    kind = "describe"
            text, spans = writer.sentence(kind, wtype)
        out.append({"text": text, "position": pos, "label": label, "types": [wtype] if wtype else [],
                    "spans": spans})
    return out


def _unknown(scene: Scene, rng: random.Random) -> str:
    return rng.choice(UNKNOWN_CLAIMS)


__all__ = ["CaptionerProfile", "PROFILES", "PROFILE_BY_NAME", "TYPES", "caption"]
