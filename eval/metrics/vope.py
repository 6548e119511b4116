"""VOPE (voluntary-imagined object presence evaluation): hallucination in factual description vs voluntary imagination.

For a model's free-form response (captioning, reasoning, story writing) the mentioned objects are extracted
(vocabulary + synonyms, CHAIR-style), the model is asked a presence re-check question for each, and with the
ground-truth presence every object falls in one set:

    believes present & present -> D_T (true description)     believes present & absent -> D_H (hallucination)
    believes absent  & absent  -> I_T (true imagination)     believes absent  & present -> I_H (hallucination)

    Hal-D = |D_H| / (|D_T| + |D_H|)      Hal-I = |I_H| / (|I_T| + |I_H|)
    Exp   = (|I_T| + |I_H|) / all        CHAIR_i = (|D_H| + |I_T|) / all   (Eqs. 1-4)

All four, and the unparsed and defaulted rates, are percentages (0–100), like the paper's tables.

Objects are counted once per response. A re-check answer is read as yes/no from its start ("Yes, ...", "No.") or
from a clear free-form statement ("There is a dog ...", "There is no dog", "I don't see a dog"). One that is neither
is a parse failure: by default the object is left out of the four sets and counted in ``unparsed``; with
``default=True`` (the official code's behaviour: such replies count as yes) it is classified as believed present
and counted in ``defaulted`` as well. The official code also reads "No." as yes; that is a bug and not copied.
An optional judge scores the relevance (1-3) of every output object that is absent from the image (D_H and I_T).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from halsift.corpus.percent import ratio_percent

SETS = ("D_T", "D_H", "I_T", "I_H")


class Responder(Protocol):
    """The model under evaluation: a free-form response, and a presence re-check answer (True/False/None)."""

    def respond(self, image: Any, prompt: str) -> str: ...

    def is_present(self, image: Any, obj: str) -> bool | None: ...


class RelevanceJudge(Protocol):
    """Scores how relevant an (absent) object is to the image: 3 highly, 2 moderately, 1 not at all."""

    def relevance(self, image: Any, obj: str) -> int: ...


class ObjectVocabulary:
    """Canonical object names with synonyms (plural forms included); extraction prefers the longest phrase."""

    def __init__(self, synonyms: Mapping[str, Iterable[str]]) -> None:
        self.synonyms = {k: sorted({k, *v}, key=len, reverse=True) for k, v in synonyms.items()}
        pairs = sorted(((s.lower(), k) for k, vs in self.synonyms.items() for s in vs), key=lambda p: -len(p[0]))
        self._lookup = dict(pairs)
        alt = "|".join(re.escape(s) for s, _ in pairs)
        self._re = re.compile(rf"\b(?:{alt})(?:s|es)?\b", re.I)

    def extract(self, text: str) -> list[str]:
        """Canonical objects mentioned in ``text``, each once, in order of first mention."""
        out: list[str] = []
        for m in self._re.finditer(text):
            word = m.group(0).lower()
            canon = self._lookup.get(word) or self._lookup.get(word[:-1]) or self._lookup.get(word[:-2])
            if canon and canon not in out:
                out.append(canon)
        return out


def presence_question(obj: str) -> str:
    """The re-check question asked for every extracted object."""
    return f"Is there a {obj} in the image? Please answer yes or no."


_NO_RE = re.compile(r"^\W*(?:no|nope)\b|\bthere (?:is|are) no\b|\bthere (?:isn't|aren't|is not|are not)\b|"
                    r"\bi (?:do not|don't|cannot|can't|could not|couldn't|did not|didn't) see\b|"
                    r"\b(?:is|are) not (?:present|visible)\b|\bnot (?:present|visible) in\b", re.I)
_YES_RE = re.compile(r"^\W*(?:yes|yeah|yep)\b|^\W*there (?:is|are) (?:a|an|some|one|two|three|several|\d+)\b|"
                     r"^\W*i (?:can )?see\b|\b(?:is|are) (?:present|visible) in the image\b", re.I)


def parse_yes_no(text: str) -> bool | None:
    """'Yes, ...' / 'There is a dog ...' -> True; 'No.' / 'There is no dog' / "I don't see one" -> False; anything
    else -> None. A reply starting with yes or no is read by that word."""
    t = str(text).strip()
    m = re.match(r"\W*(yes|no)\b", t, re.I)
    if m:
        return m.group(1).lower() == "yes"
    if _NO_RE.search(t):
        return False
    return True if _YES_RE.search(t) else None


@dataclass
class VopeRecord:
    """One evaluated response: its objects sorted into the four sets, plus unparsed and relevance scores."""

    model: str
    task: str
    image_id: str
    objects: dict[str, list[str]] = field(default_factory=lambda: {s: [] for s in SETS})
    unparsed: list[str] = field(default_factory=list)
    relevance: dict[str, int] = field(default_factory=dict)
    defaulted: list[str] = field(default_factory=list)  # unparsed re-checks classified with the default answer


def classify(objects: Sequence[str], beliefs: Mapping[str, bool | None], present: Iterable[str],
             default: bool | None = None) -> dict[str, list[str]]:
    """Sort ``objects`` into D_T/D_H/I_T/I_H from the model's beliefs and the ground truth; unparsed under
    'unparsed', or with ``default`` classified as that answer and listed under 'defaulted'."""
    truth = set(present)
    out: dict[str, list[str]] = {s: [] for s in (*SETS, "unparsed")}
    if default is not None:
        out["defaulted"] = []
    for o in objects:
        b = beliefs.get(o)
        if b is None and default is not None:
            out["defaulted"].append(o)
            b = default
        if b is None:
            out["unparsed"].append(o)
        elif b:
            out["D_T" if o in truth else "D_H"].append(o)
        else:
            out["I_H" if o in truth else "I_T"].append(o)
    return out


def evaluate_response(model: str, task: str, image_id: str, image: Any, response: str, present: Iterable[str],
                      vocab: ObjectVocabulary, responder: Responder, judge: RelevanceJudge | None = None) -> VopeRecord:
    """Extract the objects of ``response``, re-check each with ``responder`` and classify against ``present``."""
    objects = vocab.extract(response)
    beliefs = {o: responder.is_present(image, o) for o in objects}
    sets = classify(objects, beliefs, present)
    rec = VopeRecord(model, task, image_id, {s: sets[s] for s in SETS}, sets["unparsed"])
    if judge is not None:
        for o in sets["D_H"] + sets["I_T"]:
            rec.relevance[o] = int(judge.relevance(image, o))
    return rec


def vope_rates(counts: Mapping[str, int]) -> dict[str, float]:
    """Hal-D, Hal-I, Exp and CHAIR_i (%, 0–100) from the sizes of D_T, D_H, I_T, I_H (NaN where a denominator
    is 0)."""
    dt, dh, it, ih = (int(counts.get(s, 0)) for s in SETS)
    allc = dt + dh + it + ih
    return {"hal_d": ratio_percent(dh, dt + dh), "hal_i": ratio_percent(ih, it + ih),
            "exp": ratio_percent(it + ih, allc), "chair_i": ratio_percent(dh + it, allc)}


def records_frame(records: Sequence[VopeRecord]) -> pd.DataFrame:
    """One row per record: model, task, image_id, |D_T|, |D_H|, |I_T|, |I_H|, unparsed, defaulted."""
    return pd.DataFrame([{"model": r.model, "task": r.task, "image_id": r.image_id,
                          **{s: len(r.objects[s]) for s in SETS}, "unparsed": len(r.unparsed),
                          "defaulted": len(r.defaulted)} for r in records],
                        columns=["model", "task", "image_id", *SETS, "unparsed", "defaulted"])


def vope_metrics(records: Sequence[VopeRecord]) -> dict[str, float]:
    """Flat metrics per (model, task) and per model: ``<model>/<task>/{hal_d,hal_i,exp,chair_i}``, set sizes,
    ``unparsed_rate``, ``defaulted_rate`` (rates in %, 0–100; of the objects mentioned); relevance score counts
    ``<model>/<task>/relevance/{D_H,I_T}/{1,2,3}`` when judged."""
    if not records:
        raise ValueError("vope_metrics: no records")
    df = records_frame(records)
    m: dict[str, float] = {}
    for keys, g in [((mo, t), g) for (mo, t), g in df.groupby(["model", "task"])] + \
                   [((mo, "all"), g) for mo, g in df.groupby("model")]:
        counts = {s: int(g[s].sum()) for s in SETS}
        prefix = "/".join(keys)
        for k, v in vope_rates(counts).items():
            m[f"{prefix}/{k}"] = v
        for s in SETS:
            m[f"{prefix}/n/{s}"] = counts[s]
        mentioned = sum(counts.values()) + int(g["unparsed"].sum())
        m[f"{prefix}/unparsed_rate"] = ratio_percent(int(g["unparsed"].sum()), mentioned)
        m[f"{prefix}/defaulted_rate"] = ratio_percent(int(g["defaulted"].sum()), mentioned)
    judged = [r for r in records if r.relevance]
    for r in judged:
        for s in ("D_H", "I_T"):
            for o in r.objects[s]:
                for prefix in (f"{r.model}/{r.task}", f"{r.model}/all"):
                    key = f"{prefix}/relevance/{s}/{r.relevance[o]}"
                    m[key] = m.get(key, 0) + 1
    return m


def chair_i(records: Sequence[VopeRecord], present: Mapping[str, Iterable[str]]) -> float:
    """CHAIR_i (%, 0–100) computed directly (objects mentioned but absent from the image / objects mentioned),
    ignoring the re-check answers: the quantity Eq. 4 rewrites as (|D_H| + |I_T|) / all."""
    absent = total = 0
    for r in records:
        truth = set(present[r.image_id])
        objs = [o for s in SETS for o in r.objects[s]]
        total += len(objs)
        absent += sum(o not in truth for o in objs)
    return ratio_percent(absent, total)


def read_responses(path) -> list[dict]:
    """User responses (JSONL): model, task, image_id, response, present (ground-truth object list) and
    ``presence`` (object -> yes/no reply or bool); optional ``relevance`` (object -> 1-3)."""
    import json
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    rows = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}:{n}: not JSON ({e.msg})") from None
            for k in ("model", "task", "image_id", "response", "present", "presence"):
                if k not in r:
                    raise ValueError(f"{p}:{n}: missing key {k!r} (need model, task, image_id, response, present, presence)")
            if not isinstance(r["presence"], dict) or not isinstance(r["present"], list):
                raise ValueError(f"{p}:{n}: 'presence' must be an object and 'present' a list")
            rows.append(r)
    if not rows:
        raise ValueError(f"{p}: no responses")
    return rows


class TableResponder:
    """A :class:`Responder` replaying recorded presence answers (``presence[image_id][object]``)."""

    def __init__(self, presence: Mapping[str, Mapping[str, Any]]) -> None:
        self.presence = presence

    def respond(self, image: Any, prompt: str) -> str:
        raise NotImplementedError("TableResponder only replays presence answers")

    def is_present(self, image: Any, obj: str) -> bool | None:
        v = self.presence.get(image, {}).get(obj)
        return v if isinstance(v, bool) or v is None else parse_yes_no(v)


__all__ = ["SETS", "Responder", "RelevanceJudge", "ObjectVocabulary", "presence_question", "parse_yes_no",
           "VopeRecord", "classify", "evaluate_response", "vope_rates", "records_frame", "vope_metrics", "chair_i",
           "read_responses", "TableResponder"]
