"""Judge prompts (verbatim from AlignBench appendix E.1 / Table D) and the score parser.

The prompt texts keep the seed's wording and typography (the curly quotes in ``“score”: 50``, "return low the
score", "** two or three **"). The caption follows ``Caption:`` on a new paragraph.
"""

from __future__ import annotations

import json
import math
import re

SCORE_PROMPT = (
    "You are given an image and a caption describing the given image. Your task is to judge if the caption "
    "describes the image correctly. If you think the sentence does not describe the image correctly, return low "
    "the score. If you think there is no mistake in the caption, return high score. Judge the correctness from "
    "0-100 points. Return the output in the form of dictionary, e.g., \u201cscore\u201d: 50. Please first output "
    "the correctness points before explaining the reason for the score."
)

COT_PROMPT = (
    "You are given an image and a caption describing the given image. Your task is to judge if the caption "
    "describes the image correctly. If you think the sentence does not describe the image correctly, return low "
    "the score. If you think there is no mistake in the caption, return high score. Judge the correctness from "
    "0-100 points. Return the output in the form of dictionary, e.g., \u201cscore\u201d: 50. Please first explain "
    "the reason of scoring in ** two or three ** sentences and output the correctness points as shown above."
)

LOCALIZE_PROMPT = (
    "You are given an image and a caption describing the given image. Your task is to localize the segment of the "
    "caption, which describes the image incorrectly. Please output the segment by marking the incorrect parts by "
    "**[]**, e.g., A **[red]** bird singing in a tree. Return the output in the form of a dictionary. Example "
    "format.\n\n```json\n{\n \"output\": \"A **[red]** bird singing in a tree.\"\n}\n```"
)

# VQAScore (Lin et al. 2024) question, for mode ``yes_prob``.
YES_NO_PROMPT = 'Does this figure show "{sentence}"? Please answer yes or no.'

# Table D: the preceding sentences, then the target sentence, then the question about the target.
CONTEXT_TEMPLATE = "{context} {sentence} Think about the correctness of **{sentence}**."

CAPTION_LEAD = "\n\nCaption:"  # the caption text follows after one space

# One request per caption (the ``api`` detector's ``per_caption``): the seeds' 0-100 judgement asked for every
# sentence at once, answered as one JSON list; the numbered sentences follow CAPTION_LEAD, one per line.
PER_CAPTION_PROMPT = (
    "You are given an image and a caption describing the given image, split into numbered sentences. For each "
    "sentence, judge if it describes the image correctly. If the sentence does not describe the image correctly, "
    "return a low score; if there is no mistake in it, return a high score. Judge the correctness from 0-100 points. "
    "Return only a JSON list with one score per sentence, in order, e.g. [90, 15, 70]."
)


def numbered_sentences(sentences: list[str]) -> str:
    """``1. first\n2. second ...``: the caption text of :data:`PER_CAPTION_PROMPT`."""
    return "\n".join(f"{i + 1}. {s.strip()}" for i, s in enumerate(sentences))


def parse_score_list(text: str, n: int) -> list[float] | None:
    """The ``n`` scores of a per-caption reply (the first JSON list of ``n`` numbers in 0-100), or ``None``."""
    for m in re.finditer(r"\[[^\[\]]*\]", text):
        try:
            values = json.loads(m.group(0))
        except ValueError:
            continue
        numbers = isinstance(values, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                   for v in values)
        if numbers and len(values) == n and all(0 <= v <= 100 for v in values):
            return [float(v) for v in values]
    return None

SCORE_PREFILL = '{"score": '  # mode ``logits``: the assistant turn up to where the number goes


# Multiple-choice VQA (I-HallA's evaluation agent): the question, lettered choices, "answer with the letter only".
CHOICE_LETTERS = "ABCDE"
CHOICE_NONE = "None of the above"
CHOICE_PROMPT = ("Look at the image and answer the question. If none of the choices is right or you are unsure, "
                 "choose E) {none}.\nQuestion: {question}\nChoices: {options}\nAnswer with the letter only.")


def choice_prompt(question: str, choices: list[str] | tuple[str, ...]) -> str:
    """The multiple-choice prompt: ``question`` and ``choices`` lettered A, B, ... (at most five)."""
    if not 1 <= len(choices) <= len(CHOICE_LETTERS):
        raise ValueError(f"choices: expected 1 to {len(CHOICE_LETTERS)} choices, got {len(choices)}")
    opts = " ".join(f"{l}) {c}" for l, c in zip(CHOICE_LETTERS, choices))
    return CHOICE_PROMPT.format(none=CHOICE_NONE, question=question, options=opts)


def caption_text(sentence: str, context: list[str] | None = None) -> str:
    """The text after ``Caption:``: the sentence, or (Table D) the preceding sentences plus the target."""
    if context:
        return CONTEXT_TEMPLATE.format(context=" ".join(c.strip() for c in context), sentence=sentence.strip())
    return sentence.strip()


_NUM = r"(-?\d+(?:\.\d+)?)"
_PATTERNS = [
    re.compile(r"[\"'\u201c\u201d\u2018\u2019]?score[\"'\u201c\u201d\u2018\u2019]?\s*[:=]\s*[\"']?" + _NUM, re.I),
    re.compile(r"score\s*(?:is|of|was)?\s*[:=]?\s*\**\s*" + _NUM + r"\s*(?:/\s*100|points|%)?", re.I),
    re.compile(_NUM + r"\s*/\s*100"),
    re.compile(_NUM + r"\s*(?:points|out of 100)", re.I),
]


def parse_score(text: str) -> float | None:
    """The 0–100 score in a judge reply, or ``None`` if there is none.

    Accepts a JSON object with ``score`` (``{"score": 85}``, also inside a code fence), ``"score": 85``,
    ``“score”: 85`` (the seed's curly quotes), ``Score: 85/100``, ``score is 85``, ``85/100``, ``85 points``
    and a reply that is just a number. Values outside [0, 100] are rejected (``None``).
    """
    if not isinstance(text, str):
        return None
    s = text.strip()
    candidates = [m.group(1) for m in re.finditer(r"```(?:json)?\s*(.*?)```", s, re.S | re.I)] + [s]
    for c in candidates:
        m = re.search(r"\{.*?\}", c, re.S)
        if m:
            try:
                obj = json.loads(m.group(0))
            except (json.JSONDecodeError, ValueError):
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("score"), (int, float, str)):
                v = _number(obj["score"])
                if v is not None:
                    return v
    for pat in _PATTERNS:
        m = pat.search(s)
        if m:
            return _number(m.group(1))
    if re.fullmatch(r"\s*" + _NUM + r"\s*\.?\s*", s):
        return _number(s.strip().rstrip("."))
    return None


def _number(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(x) or x < 0 or x > 100:
        return None
    return x


__all__ = ["CAPTION_LEAD", "CHOICE_LETTERS", "CHOICE_NONE", "CHOICE_PROMPT", "choice_prompt", "CONTEXT_TEMPLATE", "COT_PROMPT", "LOCALIZE_PROMPT", "SCORE_PREFILL", "SCORE_PROMPT",
           "YES_NO_PROMPT", "caption_text", "parse_score"]
