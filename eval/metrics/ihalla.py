"""I-HallA (Lim et al., AAAI 2025): image hallucination of text-to-image models measured by multiple-choice VQA.

Per prompt p there are |Q^p| (five) questions, each with five choices (E = "None of the above"), a gold letter and
a composition of interest (CoI). A VQA model answers every question for a generated image, and

    I-HallA = 1/|P| sum_p ( 1/|Q^p| sum_q 1[VQA(p, q, c) = g] )          (Eq. 1)
    I-HallA† = 1/|P| sum_p 1[all questions of p answered correctly]       (strict variant, Table 3)

An answer that could not be parsed counts as wrong and is reported as a failure. This module holds the QA-set
model, the answerer interface (+ a VLM multiple-choice adapter), the loader for the official layout, the scores,
their breakdowns per CoI and per category, and the correlation with reference (human) judgments.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from halsift.corpus.errors import InputError
from halsift.corpus.percent import percent

LETTERS = "ABCDE"
NONE_CHOICE = "None of the above"
COIS = ("color", "counting", "existence", "others", "posture", "relation", "scene", "shape", "size")
_COI_ALIASES = {"colour": "color", "count": "counting", "other": "others", "position": "relation"}


class QAFormatError(InputError):
    """A QA file or predictions file that does not follow the expected layout."""


@dataclass(frozen=True)
class QAItem:
    """One multiple-choice question: five choices (the last is 'None of the above'), a gold letter and a CoI."""

    prompt_id: str
    qid: int  # 0-based position among the prompt's questions
    question: str
    choices: tuple[str, ...]
    answer: str  # gold letter A-E
    coi: str

    def __post_init__(self) -> None:
        where = f"prompt {self.prompt_id!r} question {self.qid + 1}"
        if len(self.choices) != 5:
            raise QAFormatError(f"{where}: expected 5 choices (A-E), got {len(self.choices)}")
        if self.choices[-1].strip().lower() != NONE_CHOICE.lower():
            raise QAFormatError(f"{where}: choice E must be {NONE_CHOICE!r}, got {self.choices[-1]!r}")
        if self.answer not in LETTERS:
            raise QAFormatError(f"{where}: gold answer must be one of A-E, got {self.answer!r}")
        if self.coi not in COIS:
            raise QAFormatError(f"{where}: CoI {self.coi!r} is not one of {', '.join(COIS)}")


@dataclass
class PromptQA:
    """The QA set of one prompt."""

    prompt_id: str
    prompt: str
    category: str
    items: list[QAItem] = field(default_factory=list)


class VqaAnswerer(Protocol):
    """Answers a multiple-choice question about an image: (letter A-E or None, parsed)."""

    def answer(self, image: Any, question: str, choices: Sequence[str]) -> tuple[str | None, bool]: ...


def normalize_coi(value: str) -> str:
    """'Color' / 'colour' / 'Counting ' -> the canonical lower-case CoI name."""
    v = str(value).strip().lower()
    return _COI_ALIASES.get(v, v)


_LETTER_PATTERNS = (re.compile(r"answer\s*(?:is|:)?\s*\(?([A-E])\b", re.I), re.compile(r"\(([A-E])\)", re.I))
_LEADING_LETTER = re.compile(r"^\(?([A-E])(?:$|[\s\).:\],])", re.I)


def official_segment(text: str) -> str:
    """The part of a reply the official I-HallA code reads (agents/EvaluationAgent.py): after ``Answer:`` up to
    the end of that line, else the whole reply, stripped. It then compares the first character, ignoring case."""
    t = str(text or "")
    return t.split("Answer:", 1)[1].split("\n")[0].strip() if "Answer:" in t else t.strip()


def official_letter(text: str) -> str | None:
    """The letter the official code takes from a reply (upper-cased), None when its first character is no A-E."""
    c = official_segment(text)[:1].upper()
    return c if c and c in LETTERS else None


def parse_letter(text: str, choices: Sequence[str] = ()) -> str | None:
    """The answer letter in a model's reply, or None.

    Like the official code, the reply's ``Answer:`` line (else the reply) is read and a leading letter is
    accepted in either case ('b', 'B) Tetrahedral', '(c)'); a reply that is exactly a choice's text gives that
    choice (the official code would read its first character); 'The answer is (C)' / '(C)' elsewhere are also
    read (the official code counts them wrong). ``load_predictions`` counts the replies where this differs from
    :func:`official_letter`."""
    if not text:
        return None
    seg = official_segment(text)
    low = seg.lower().rstrip(".")
    for letter, c in zip(LETTERS, choices):
        if low == c.strip().lower():
            return letter
    m = _LEADING_LETTER.match(seg)
    if m:
        return m.group(1).upper()
    for pat in _LETTER_PATTERNS:
        m = pat.search(text)
        if m:
            return m.group(1).upper()
    return None


def mc_prompt(question: str, choices: Sequence[str]) -> str:
    """The evaluation-agent prompt: the question, lettered choices, and the instruction to answer with a letter."""
    from halsift.filtering.detectors.vlm_prompts import choice_prompt

    return choice_prompt(question, tuple(choices))


class ChoiceVlmAnswerer:
    """Adapts a VLM to :class:`VqaAnswerer`, by letter logits (``score_letters``) or by generation + parsing.

    ``score_letters(image, prompt, letters) -> scores`` (e.g. next-token log-probabilities of 'A'..'E') is preferred
    and never fails; ``generate(image, prompt) -> text`` is parsed with :func:`parse_letter` and unparsable replies
    are counted in ``failures``.
    """

    def __init__(self, generate: Callable[[Any, str], str] | None = None,
                 score_letters: Callable[[Any, str, Sequence[str]], Sequence[float]] | None = None) -> None:
        if generate is None and score_letters is None:
            raise ValueError("ChoiceVlmAnswerer needs generate or score_letters")
        self.generate, self.score_letters = generate, score_letters
        self.asked = self.failures = 0

    def answer(self, image: Any, question: str, choices: Sequence[str]) -> tuple[str | None, bool]:
        self.asked += 1
        prompt = mc_prompt(question, choices)
        if self.score_letters is not None:
            scores = np.asarray(self.score_letters(image, prompt, list(LETTERS)), dtype=float)
            return LETTERS[int(np.argmax(scores))], True
        letter = parse_letter(self.generate(image, prompt), choices)
        if letter is None:
            self.failures += 1
            return None, False
        return letter, True


def _pixels(image: Any) -> Any:
    """A PIL image from what :func:`answer_all` passes (a PIL image, or a synthetic image with ``.image``)."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    if hasattr(image, "image"):
        return image.image
    raise TypeError(f"VLM answerer: expected a PIL image (or an object with .image), got {type(image).__name__}")


ANSWER_MODES = ("logits", "generate")  # how a VLM answers a multiple-choice question


def vlm_answerer(detector_or_spec: Any, mode: str = "logits") -> ChoiceVlmAnswerer:
    """A :class:`ChoiceVlmAnswerer` backed by the VLM judge a detector lends (capability ``vlm-judge``: a ``vlm:...``
    spec, or a ``lora:`` adapter of one), given as a detector or a spec string.

    ``mode="logits"``: one forward pass per question, the answer is the letter with the highest log-probability
    (:meth:`VlmJudge.letter_logprobs`; never fails). ``mode="generate"``: greedy reply
    (:meth:`VlmJudge.generate_text`) parsed by :func:`parse_letter`; unparsable replies count as failures. A
    detector without a judge raises :class:`~halsift.filtering.detectors.base.MissingCapability` naming it.
    """
    if mode not in ANSWER_MODES:
        raise ValueError(f"mode={mode!r}: expected one of {ANSWER_MODES}")
    det = detector_or_spec
    if isinstance(det, (str, os.PathLike)):
        from halsift.filtering.detectors.spec import load_detector

        det = load_detector(det)
    judge = det.vlm_judge("the I-HallA VLM answerer")
    if mode == "generate":
        ans = ChoiceVlmAnswerer(generate=lambda image, prompt: judge.generate_text(_pixels(image), prompt))
    else:
        def score(image: Any, prompt: str, letters: Sequence[str]) -> list[float]:
            lp = judge.letter_logprobs(_pixels(image), prompt, letters)
            return [lp[l] for l in letters]

        ans = ChoiceVlmAnswerer(score_letters=score)
    ans.detector = det
    return ans


def answer_all(qa_sets: Sequence[PromptQA], images: Mapping[str, Mapping[str, Any]], answerer: VqaAnswerer,
               show_progress: bool = False) -> pd.DataFrame:
    """Ask every question of every prompt for every generator's image; one row per (generator, question).

    ``images[generator][prompt_id]`` is whatever the answerer takes; prompts without an image are skipped.
    """
    from halsift.corpus.progress import progress

    rows = []
    total = sum(len(q.items) for q in qa_sets) * len(images)
    bar = progress(total=total, desc="ihalla", unit="q", disable=not show_progress)
    for gen, by_prompt in images.items():
        for qa in qa_sets:
            if qa.prompt_id not in by_prompt:
                continue
            img = by_prompt[qa.prompt_id]
            for it in qa.items:
                pred, parsed = answerer.answer(img, it.question, it.choices)
                rows.append(_row(gen, qa, it, pred, parsed))
                bar.update()
    bar.close()
    return pd.DataFrame(rows, columns=_COLUMNS)


_COLUMNS = ["generator", "prompt_id", "category", "qid", "coi", "gold", "pred", "parsed", "correct"]


def _row(gen: str, qa: PromptQA, it: QAItem, pred: str | None, parsed: bool) -> dict:
    return {"generator": gen, "prompt_id": qa.prompt_id, "category": qa.category, "qid": it.qid, "coi": it.coi,
            "gold": it.answer, "pred": pred, "parsed": bool(parsed and pred is not None),
            "correct": bool(pred is not None and pred == it.answer)}


def prompt_scores(answers: pd.DataFrame) -> pd.DataFrame:
    """Per (generator, prompt): ``score`` (fraction correct, the inner sum of Eq. 1) and ``strict`` (all correct)."""
    g = answers.groupby(["generator", "prompt_id", "category"], sort=True)["correct"]
    out = g.mean().rename("score").to_frame()
    out["strict"] = g.all().astype(float)
    return out.reset_index()


def ihalla_scores(answers: pd.DataFrame) -> pd.DataFrame:
    """Per generator: I-HallA (Eq. 1), I-HallA† (strict), number of prompts and parse failure rate (%, 0–100)."""
    ps = prompt_scores(answers)
    out = ps.groupby("generator").agg(ihalla=("score", "mean"), strict=("strict", "mean"), prompts=("score", "size"))
    out["failure_rate"] = (1.0 - answers.groupby("generator")["parsed"].mean()).map(percent)
    return out


def correlations(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Pearson r, Spearman rho and Kendall tau (scipy.stats); NaN when fewer than 2 points or a constant side."""
    from scipy import stats

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"correlations: lengths differ ({len(x)} vs {len(y)})")
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"pearson": float("nan"), "spearman": float("nan"), "kendall": float("nan")}
    return {"pearson": float(stats.pearsonr(x, y)[0]), "spearman": float(stats.spearmanr(x, y)[0]),
            "kendall": float(stats.kendalltau(x, y)[0])}


def ihalla_metrics(answers: pd.DataFrame, reference: pd.DataFrame | None = None) -> dict[str, float]:
    """Flat metrics: ``ihalla/<gen>``, ``ihalla_strict/<gen>``, ``ihalla/<gen>/coi/<coi>``,
    ``ihalla/<gen>/category/<cat>`` (scores on the paper's 0–1 scale), ``failure_rate[/<gen>]`` (%, 0–100), and
    with ``reference`` (columns generator, prompt_id, reference) the per-image
    ``correlation/{pearson,spearman,kendall}``."""
    if answers.empty:
        raise ValueError("ihalla_metrics: no answers (no prompt had an image for any generator)")
    m: dict[str, float] = {}
    sc = ihalla_scores(answers)
    for gen, r in sc.iterrows():
        m[f"ihalla/{gen}"] = r["ihalla"]
        m[f"ihalla_strict/{gen}"] = r["strict"]
        m[f"failure_rate/{gen}"] = r["failure_rate"]
    m["ihalla/mean"] = float(sc["ihalla"].mean())
    m["ihalla_strict/mean"] = float(sc["strict"].mean())
    m["failure_rate"] = percent(1.0 - answers["parsed"].mean())
    if "official_pred" in answers:  # replies read from a file: how often the official parser reads another letter
        ours, off = answers["pred"].fillna(""), answers["official_pred"].fillna("")
        m["parse/differs_from_official"] = float((ours != off).sum())
        m["parse/official_correct_rate"] = percent((off == answers["gold"]).mean())
    for (gen, coi), v in answers.groupby(["generator", "coi"])["correct"].mean().items():
        m[f"ihalla/{gen}/coi/{coi}"] = float(v)
    ps = prompt_scores(answers)
    for (gen, cat), v in ps.groupby(["generator", "category"])["score"].mean().items():
        m[f"ihalla/{gen}/category/{cat}"] = float(v)
    if reference is not None:
        j = ps.merge(reference, on=["generator", "prompt_id"], how="inner")
        for k, v in correlations(j["score"], j["reference"]).items():
            m[f"correlation/{k}"] = v
        m["correlation/n"] = float(len(j))
    return m


# ---------------------------------------------------------------------------------------------------------------
# Files: the official QA layout (index, CoI, question, choices, answer; xlsx or CSV) and predictions / references.

def _key(name: str) -> str:
    return re.sub(r"[\s_\-()]+", "", str(name).strip().lower())


_COLS = {"index": ("index", "id", "promptid", "promptindex", "no", "idx"),
         "coi": ("coi", "composition", "compositionofinterest", "compositionsofinterest", "cois"),
         "question": ("question", "questions", "q"),
         "choices": ("choices", "choice", "options"),
         "answer": ("answer", "goldanswer", "gold", "correctanswer", "answers"),
         "category": ("category", "domain"), "prompt": ("prompt", "text")}


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """A CSV/TSV or xlsx file as a DataFrame of strings (xlsx needs openpyxl)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    if p.suffix.lower() in (".xlsx", ".xls"):
        try:
            import openpyxl  # noqa: F401
        except ImportError:
            raise QAFormatError(f"{p}: reading xlsx needs openpyxl (pip install openpyxl) or save it as CSV") from None
        return pd.read_excel(p, dtype=str).fillna("")
    return pd.read_csv(p, dtype=str, sep="\t" if p.suffix.lower() == ".tsv" else ",").fillna("")


def _find(df: pd.DataFrame, what: str, path: Path, required: bool = True) -> str | None:
    keys = {_key(c): c for c in df.columns}
    for alias in _COLS[what]:
        if alias in keys:
            return keys[alias]
    if required:
        raise QAFormatError(f"{path}: no {what!r} column (expected one of {', '.join(_COLS[what])}; "
                            f"found {', '.join(map(str, df.columns))})")
    return None


def split_choices(text: str) -> list[str]:
    """'A) Two B) Three C) Four D) Five E) None of the above' (or one per line) -> ['Two', ..., 'None of the above']."""
    parts = re.split(r"(?:^|\s|\n)\(?([A-E])\)\s*", str(text).strip())
    found = {parts[i]: parts[i + 1].strip().rstrip(",;") for i in range(1, len(parts) - 1, 2)}
    return [found[l] for l in LETTERS if l in found]


def load_qa(path: str | os.PathLike) -> list[PromptQA]:
    """Read QA sets in the official layout: one row per question with index (prompt), CoI, question, choices
    (one 'A) .. E) ..' string, or columns A-E) and answer (a letter, 'B) text', or the choice text)."""
    p = Path(path)
    df = read_table(p)
    c_idx, c_coi, c_q, c_ans = (_find(df, w, p) for w in ("index", "coi", "question", "answer"))
    c_ch = _find(df, "choices", p, required=False)
    letter_cols = [next((c for c in df.columns if _key(c) in (l.lower(), f"choice{l.lower()}", f"option{l.lower()}")),
                        None) for l in LETTERS]
    if c_ch is None and any(c is None for c in letter_cols[:4]):
        raise QAFormatError(f"{p}: no 'choices' column and no per-letter columns A-D")
    c_cat, c_prompt = _find(df, "category", p, False), _find(df, "prompt", p, False)
    sets: dict[str, PromptQA] = {}
    for i, r in df.iterrows():
        line = f"{p}: row {i + 2}"
        pid = str(r[c_idx]).strip()
        if not pid:
            raise QAFormatError(f"{line}: empty {c_idx!r}")
        choices = split_choices(r[c_ch]) if c_ch else [str(r[c]).strip() for c in letter_cols if c is not None]
        choices = [c for c in choices if c]
        if len(choices) == 4:
            choices.append(NONE_CHOICE)
        if len(choices) != 5:
            raise QAFormatError(f"{line}: expected 5 choices A-E in {c_ch or 'columns A-E'!r}, got {len(choices)}")
        ans = parse_letter(str(r[c_ans]), choices)
        if ans is None:
            raise QAFormatError(f"{line}: answer {r[c_ans]!r} is neither a letter A-E nor one of the choices")
        qa = sets.setdefault(pid, PromptQA(pid, str(r[c_prompt]) if c_prompt else "",
                                           str(r[c_cat]).strip() if c_cat and str(r[c_cat]).strip() else "all"))
        try:
            qa.items.append(QAItem(pid, len(qa.items), str(r[c_q]).strip(), tuple(choices), ans,
                                   normalize_coi(r[c_coi])))
        except QAFormatError as e:
            raise QAFormatError(f"{line}: {e}") from None
    if not sets:
        raise QAFormatError(f"{p}: no QA rows")
    return list(sets.values())


def load_predictions(path: str | os.PathLike, qa_sets: Sequence[PromptQA]) -> pd.DataFrame:
    """Precomputed VQA answers (columns generator, index, question_no 1-based, prediction) -> the answers table."""
    p = Path(path)
    df = read_table(p)
    keys = {_key(c): c for c in df.columns}

    def col(*names: str) -> str:
        for n in names:
            if n in keys:
                return keys[n]
        raise QAFormatError(f"{p}: no {names[0]!r} column (expected one of {', '.join(names)})")

    c_gen, c_idx = col("generator", "model"), col("index", "id", "promptid")
    c_no, c_pred = col("questionno", "qno", "question", "qid"), col("prediction", "pred", "answer", "response")
    by_id = {qa.prompt_id: qa for qa in qa_sets}
    rows = []
    for i, r in df.iterrows():
        pid = str(r[c_idx]).strip()
        if pid not in by_id:
            raise QAFormatError(f"{p}: row {i + 2}: index {pid!r} is not in the QA file")
        qa = by_id[pid]
        try:
            qno = int(str(r[c_no]).strip().lstrip("Qq"))
        except ValueError:
            raise QAFormatError(f"{p}: row {i + 2}: question_no {r[c_no]!r} is not a number 1-{len(qa.items)}") from None
        if not 1 <= qno <= len(qa.items):
            raise QAFormatError(f"{p}: row {i + 2}: question_no {qno} outside 1-{len(qa.items)} for index {pid!r}")
        it = qa.items[qno - 1]
        pred = parse_letter(str(r[c_pred]), it.choices)
        rows.append({**_row(str(r[c_gen]), qa, it, pred, pred is not None),
                     "official_pred": official_letter(str(r[c_pred]))})
    return pd.DataFrame(rows, columns=_COLUMNS + ["official_pred"])


def load_reference(path: str | os.PathLike) -> pd.DataFrame:
    """Reference (e.g. human) per-image judgments: columns generator, index, score -> generator, prompt_id, reference."""
    p = Path(path)
    df = read_table(p)
    keys = {_key(c): c for c in df.columns}
    need = {"generator": ("generator", "model"), "prompt_id": ("index", "id", "promptid"),
            "reference": ("score", "reference", "human")}
    cols = {}
    for k, names in need.items():
        c = next((keys[n] for n in names if n in keys), None)
        if c is None:
            raise QAFormatError(f"{p}: no {names[0]!r} column (expected one of {', '.join(names)})")
        cols[k] = c
    out = pd.DataFrame({k: df[c].astype(str).str.strip() for k, c in cols.items()})
    try:
        out["reference"] = out["reference"].astype(float)
    except ValueError:
        raise QAFormatError(f"{p}: column {cols['reference']!r} must hold numbers") from None
    return out


__all__ = ["LETTERS", "NONE_CHOICE", "COIS", "QAFormatError", "QAItem", "PromptQA", "VqaAnswerer",
           "ChoiceVlmAnswerer", "ANSWER_MODES", "vlm_answerer", "parse_letter", "mc_prompt", "answer_all", "prompt_scores", "ihalla_scores",
           "correlations", "ihalla_metrics", "load_qa", "load_predictions", "load_reference", "split_choices",
           "normalize_coi", "read_table"]
