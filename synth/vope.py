"""VOPE on the synthetic world: an object vocabulary, simulated responders with designed imagination and
hallucination behaviour, and a relevance judge.

A responder writes three object mentions per response. Each mention is *imagined* with probability ``exp`` (the
task's expressiveness times the responder's), otherwise *described*. A described mention names an object that is
absent with probability ``hal_d`` (it still answers "yes" when re-checked: D_H), else a present one (D_T). An
imagined mention names an object that is present with probability ``hal_i`` (it answers "no": I_H), else an
invented one (I_T). Scenes hold >= 3 present objects and >= 3 absent shapes, so no pool runs dry and the expected
Hal-D, Hal-I and Exp equal the designed values.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from .scene import SHAPES, Scene, sample_scene
from .ihalla import SynthImage
from halsift.corpus.percent import percent
from halsift.eval.metrics.vope import ObjectVocabulary, VopeRecord, evaluate_response
from halsift.eval.runs.vope import VopeRecords

SYNONYMS = {"circle": ["disc", "disk", "ring"], "square": ["block"], "triangle": [], "star": [],
            "diamond": ["rhombus", "lozenge"], "hexagon": [], "sign": ["signboard", "placard"],
            "tree": [], "house": ["cottage"], "cloud": [], "sun": [], "bird": [], "kite": [], "ball": [], "flag": [],
            "car": ["automobile"], "dog": ["puppy"], "cat": ["kitten"], "boat": ["ship"], "dragon": [],
            "robot": [], "castle": [], "submarine": [], "moon": [], "flower": []}
IMAGINED = [k for k in SYNONYMS if k not in SHAPES and k != "sign"]
RELEVANCE = {**{s: 3 for s in SHAPES}, "sign": 3, "kite": 3, "ball": 3, "flag": 3, "tree": 2, "house": 2, "cloud": 2,
             "sun": 2, "bird": 2, "moon": 2, "flower": 2, "car": 1, "dog": 1, "cat": 1, "boat": 1, "dragon": 1,
             "robot": 1, "castle": 1, "submarine": 1}
TASKS = {"captioning": ("Describe this image in detail.", 0.1),
         "reasoning": ("What might have just happened in this image?", 0.35),
         "story": ("Write a short story inspired by this image.", 0.6)}
_DESCRIBE = ("There is a {o} in the picture.", "I can see a {o}.", "A {o} appears here.")
_IMAGINE = {"captioning": "It might remind someone of a {o}.", "reasoning": "Perhaps a {o} will arrive soon.",
            "story": "In the story, a {o} joins the adventure."}


def synth_vocabulary() -> ObjectVocabulary:
    """Shapes, the sign and the objects responders invent, with synonyms."""
    return ObjectVocabulary(SYNONYMS)


def present_objects(scene: Scene) -> list[str]:
    """Ground-truth objects of a scene: its shapes and the sign."""
    objs = sorted({g.shape for g in scene.groups})
    return objs + (["sign"] if scene.sign is not None else [])


@dataclass(frozen=True)
class ResponderProfile:
    """Designed behaviour of a simulated responder."""

    name: str
    hal_d: float  # share of described objects that are absent (believed present)
    hal_i: float  # share of imagined objects that are in fact present (believed absent)
    expressiveness: float = 1.0  # multiplies each task's share of imagined mentions

    def exp(self, task: str) -> float:
        return min(0.9, TASKS[task][1] * self.expressiveness)


PROFILES = (ResponderProfile("careful-vlm", 0.05, 0.1, 0.8), ResponderProfile("imaginative-vlm", 0.1, 0.4, 1.4),
            ResponderProfile("sloppy-vlm", 0.3, 0.2, 1.0))


class SimResponder:
    """A :class:`vope.Responder` following a :class:`ResponderProfile`; remembers what it believes per image."""

    def __init__(self, profile: ResponderProfile, seed: int = 0, mentions: int = 3, unparsed: float = 0.0) -> None:
        self.profile, self.seed, self.mentions, self.unparsed = profile, seed, mentions, unparsed
        self._beliefs: dict[str, dict[str, bool]] = {}
        self._last = ""  # re-check questions follow the response they are about

    def respond(self, image: SynthImage, prompt: str) -> str:
        task = next(t for t, (p, _) in TASKS.items() if p == prompt)
        rng = random.Random(f"{self.seed}/vope/{self.profile.name}/{task}/{image.id}")
        present = present_objects(image.scene)
        absent = [s for s in SHAPES if s not in present]
        pools = {"D_T": list(present), "D_H": absent, "I_T": list(IMAGINED), "I_H": list(present)}
        beliefs: dict[str, bool] = {}
        sentences = []
        for _ in range(self.mentions):
            if rng.random() < self.profile.exp(task):
                kind = "I_H" if rng.random() < self.profile.hal_i else "I_T"
            else:
                kind = "D_H" if rng.random() < self.profile.hal_d else "D_T"
            pool = [o for o in pools[kind] if o not in beliefs]
            obj = rng.choice(pool)
            beliefs[obj] = kind.startswith("D")
            word = rng.choice([obj] + SYNONYMS[obj])
            tpl = _IMAGINE[task] if kind.startswith("I") else rng.choice(_DESCRIBE)
            sentences.append(tpl.format(o=word))
        self._beliefs[f"{task}/{image.id}"] = beliefs
        self._last = f"{task}/{image.id}"
        return " ".join(sentences)

    def is_present(self, image: SynthImage, obj: str) -> bool | None:
        rng = random.Random(f"{self.seed}/recheck/{self.profile.name}/{image.id}/{obj}")
        if self.unparsed and rng.random() < self.unparsed:
            return None
        beliefs = self._beliefs.get(self._last, {})
        return beliefs[obj] if obj in beliefs else obj in present_objects(image.scene)


class SynthJudge:
    """:class:`vope.RelevanceJudge` from a fixed co-occurrence table (shapes and signs fit every scene)."""

    def relevance(self, image: SynthImage, obj: str) -> int:
        return RELEVANCE.get(obj, 1)


def synth_scenes(n: int, seed: int = 0) -> list[SynthImage]:
    """``n`` scenes with >= 3 present objects and >= 3 absent shapes (so responders never run out of objects)."""
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}/vope-scene/{i}")
        while True:
            scene = sample_scene(rng, n_groups=(2, 4), sign_p=0.7)
            objs = present_objects(scene)
            if len(objs) >= 3 and len(SHAPES) - len({g.shape for g in scene.groups}) >= 3:
                break
        out.append(SynthImage(f"v{i:05d}", scene))
    return out


def run_synthetic(n_images: int = 100, seed: int = 0, profiles: Sequence[ResponderProfile] = PROFILES,
                  judge: bool = True, unparsed: float = 0.0) -> tuple[list[VopeRecord], dict[str, list[str]]]:
    """Evaluate every simulated responder on every task and image; returns the records and the ground truth."""
    images = synth_scenes(n_images, seed)
    vocab = synth_vocabulary()
    truth = {im.id: present_objects(im.scene) for im in images}
    records = []
    for prof in profiles:
        resp = SimResponder(prof, seed, unparsed=unparsed)
        for task, (prompt, _) in TASKS.items():
            for im in images:
                text = resp.respond(im, prompt)
                records.append(evaluate_response(prof.name, task, im.id, im, text, truth[im.id], vocab, resp,
                                                 SynthJudge() if judge else None))
    return records, truth


def designed_rates(profile: ResponderProfile, task: str) -> dict[str, float]:
    """The expected Hal-D, Hal-I, Exp and CHAIR_i of a profile on a task, in % (0–100) like the measured ones."""
    e = profile.exp(task)
    shares = {"hal_d": profile.hal_d, "hal_i": profile.hal_i, "exp": e,
              "chair_i": (1 - e) * profile.hal_d + e * (1 - profile.hal_i)}
    return {k: percent(v) for k, v in shares.items()}


def synthetic_records(cfg) -> VopeRecords:
    """Every simulated responder on ``cfg.images`` synthetic scenes per task (``cfg``: a
    :class:`~halsift.eval.runs.vope.VopeEvalConfig` with ``synthetic``), with the designed rates, as
    :func:`~halsift.eval.runs.vope.run_vope` reads them."""
    records, _ = run_synthetic(cfg.images, cfg.seed)
    designed = {(p.name, t): designed_rates(p, t) for p in PROFILES for t in TASKS}
    return VopeRecords(records, f"synthetic world (seed {cfg.seed}, {cfg.images} images per task, simulated "
                                "responders)", designed)


__all__ = ["synthetic_records",
           "SYNONYMS", "TASKS", "PROFILES", "ResponderProfile", "SimResponder", "SynthJudge", "synth_vocabulary",
           "present_objects", "synth_scenes", "run_synthetic", "designed_rates"]
