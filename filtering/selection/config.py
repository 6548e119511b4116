"""``halsift select``'s settings (:class:`SelectConfig`: the command's flags, ``--describe``, docs/config.md and the
recipe's ``select:`` section) and its rules: how much to keep (:func:`amount`), a selection's settings
(:func:`check_selection`) and a guarantee's (:func:`check_guarantee`), for the command and recipes alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from halsift.corpus.config import WandbFlag, field, wandb_mode_field, wandb_project_field
from halsift.corpus.units import AGGS, Agg, Unit, check_unit


def captioner_field():
    """``halsift select --captioner`` and the recipe's ``select.captioner``: a new field each call."""
    return field("unknown", help="captioner recorded for samples whose json has none (img2dataset output); "
                                 "default unknown")


def source_field():
    """``halsift select --source`` and the recipe's ``select.source``: a new field each call."""
    return field("i2t", help="source recorded for samples whose json has none; default i2t (the caption describes "
                             "a real image)")


DEFAULT_KEEP = 0.2  # the share kept when no keep, top_k, threshold or max_hallucination says how much (left None
# in the settings, so that a keep given beside max_hallucination is seen and refused)
_SCALE = {"group": "at scale (out-of-core, resumable, parallel)"}
_COMPOSE = {"group": "composed selection (several --scores NAME=DIR, fields, exclusions)"}
_GUARANTEE = "with a guarantee (bounded hallucination rate)"


@dataclass
class SelectConfig:
    """``halsift select``'s settings: every flag, ``--describe`` and docs/config.md come from this class."""

    scores: list[str] = field(default_factory=list, help="score folder written by `halsift score`; repeat as "
                                                         "NAME=DIR to name several for --where/--rank (the first is "
                                                         "ranked by default)",
                              cli={"required": True, "append": True, "metavar": "[NAME=]DIR"})
    data: str = field("", help="the shards that were scored (folder / glob / brace pattern)", cli={"required": True})
    out: str = field("", help="new folder: shards + sizes.json + manifest.json + kept.parquet (rerun the same "
                              "command into it to finish a killed select)", cli={"required": True})
    keep: float | None = field(None, range="(0, 1]",
                               help="fraction of units to keep (default 0.2: the seeds' top 20%); --top-k or "
                                    "--threshold replaces it", cli={"exclusive": "amount"})
    top_k: int | None = field(None, range="[0, inf)",
                              help="number of units to keep instead of a fraction", cli={"exclusive": "amount"})
    threshold: float | None = field(None, range="[0, 100]",
                                    help="keep units scoring at least this (0-100) instead of a fraction",
                                    cli={"exclusive": "amount"})
    unit: Unit = field("sentence", help="select image-sentence pairs (default) or whole "
                                                                  "captions")
    agg: Agg = field(
        "min", help="unit caption: aggregate sentence scores by min/mean/product of probabilities, or prune (drop "
                    "low sentences, keep the rest of the caption), or repair (as prune, and a flagged sentence a detector localized "
                    "loses only its flagged words)")
    per_captioner: bool = field(False, help="apply --keep/--top-k within each captioner (in memory only)")
    random: bool = field(False, help="baseline: keep the same number of units at random (in memory only)")
    seed: int = field(0, range="[0, inf)", help="seed of --random")
    captioner: str = captioner_field()
    source: Literal["i2t", "t2i"] = source_field()
    export_keys: str | None = field(None, help="also write the kept source samples as a subset file: PATH.npy = "
                                               "DataComp uids (u8,u8, sorted; from the json 'uid'), any other name "
                                               "= one key per line", cli={"metavar": "PATH"})
    detector: str | None = field(None, help="select from this detector's rows only (a score folder holds one "
                                            "detector; without this, a folder whose parts name another detector "
                                            "is refused)")
    allow_partial: bool = field(False, help="select from a score folder whose _manifest.json is not complete "
                                            "(recorded in the manifest)")
    maxcount: int | None = field(None, range="[1, inf)",
                                 help="samples per output shard of the in-memory select (default 1000; the "
                                      "resumable select writes one output shard per input shard and refuses it)")
    no_progress: bool = field(False, help="no progress bar")
    html: bool = field(False, help="also write OUT/index.html: a browser of the selected shards' captions, each "
                                   "sentence coloured by its score and marked kept or dropped (thumbnails in "
                                   "OUT/samples/)")
    resumable: bool = field(False, help="out-of-core keys (DuckDB) and one output shard per input shard, each "
                                        "written once, shared by tasks (implied by the flags below)", cli=_SCALE)
    keys_only: bool = field(False, help="write only kept.parquet (the kept key, sentence_index, score) and the "
                                        "manifest: no shards", cli=_SCALE)
    num_tasks: int | None = field(None, range="[1, inf)",
                                  help="reshard as one of N processes sharing --out (default: $SLURM_ARRAY_TASK_COUNT "
                                       "in an array)", cli={**_SCALE, "metavar": "N"})
    task_index: int | None = field(None, range="[0, inf)",
                                   help="this process's index, 0..N-1", cli={**_SCALE, "metavar": "I"})
    memory_limit: str | None = field(None, range="[16MB, RAM]",
                                     help="DuckDB's memory limit for the keys (it spills beyond it): a size DuckDB "
                                          "reads, e.g. 512MB or 2GiB (KB..TB: 1000^i, KiB..TiB: 1024^i), from 16MB "
                                          "to this machine's memory; default 128MB", cli=_SCALE)
    wandb: WandbFlag | None = wandb_mode_field()
    wandb_project: str = wandb_project_field()
    # composed selection (halsift.filtering.selection.compose); --scores NAME=DIR may repeat
    where: str | None = field(None, help="keep only units where this holds, e.g. \"judge >= 60 and clip >= 25 and "
                                         "lang == 'en'\": names are the --scores names and the --fields columns; "
                                         "comparisons, and/or/not, + - * /, x in ('a', 'b')", cli=_COMPOSE)
    rank: str | None = field(None, help="rank the units passing --where by this expression (default: the first "
                                        "--scores) for --keep/--top-k/--threshold, e.g. \"judge + clip\"",
                             cli=_COMPOSE)
    fields: list[str] = field(default_factory=list, help="field tables joined on key (a `halsift basic` folder, or "
                                                         "parquet with a key column): their columns are names in "
                                                         "--where/--rank", cli={**_COMPOSE, "append": True,
                                                                                "metavar": "DIR"})
    exclude: list[str] = field(default_factory=list, help="drop these keys: a `halsift dedup` duplicates.parquet (or "
                                                          "its folder) or a text file of keys, one a line",
                               cli={**_COMPOSE, "append": True, "metavar": "FILE"})

    # selection with a guarantee (issue 32: halsift.filtering.selection.guaranteed)
    max_hallucination: float | None = field(
        None, range="(0, 1)",
        help="keep as much as possible while the kept units' hallucination rate is at most this fraction "
             "(0-1) with --confidence, certified on --calibration (Learn-then-Test); not with --keep, --top-k or "
             "--threshold",
        cli={"group": _GUARANTEE, "metavar": "A", "exclusive": "amount"})  # --keep/--top-k/--threshold: refused
    confidence: float = field(0.9, range="(0, 1)", help="confidence (0-1) of the --max-hallucination bound",
                              cli={"group": _GUARANTEE, "metavar": "C"})
    calibration: str | None = field(None, help="labelled units scored by the same detector: the score folder of "
                                               "a bench, or the labels .jsonl `halsift annotate` exports",
                                    cli={"group": _GUARANTEE, "metavar": "CAL"})
    calibration_captioners: str | None = field(None, help="use only the calibration bench's rows of these "
                                                          "generators (comma-separated; 'corpus' = the captioners "
                                                          "the corpus's scores name)", cli={"group": _GUARANTEE})
    calibration_splits: str | None = field(None, help="use only these splits of the calibration bench "
                                                      "(comma-separated, e.g. train,val)", cli={"group": _GUARANTEE})

    @property
    def primary_scores(self) -> str:
        """The folder of the first ``--scores`` (``NAME=DIR`` or ``DIR``): the one ranked unless ``--rank``."""
        from halsift.filtering.selection.compose import split_scores

        return split_scores(self.scores)[0][1]

    def validate(self) -> None:
        if not self.scores:
            raise ValueError("scores: give at least one score folder")
        check_selection("", self.unit, self.agg, self.top_k, self.threshold)
        if self.agg != "min" and self.unit != "caption":
            raise ValueError(f"--agg {self.agg}: only used with --unit caption")
        if self.keys_only and (self.html or self.export_keys):
            raise ValueError(f"--keys-only writes no shards; {'--html' if self.html else '--export-keys'} reads "
                             "them: drop one of the two")
        check_guarantee("", self.max_hallucination, self.confidence, self.calibration, self.top_k, self.threshold,
                        self.agg, self.random or self.per_captioner, composed=bool(self.where or self.rank),
                        keep=self.keep)


def check_selection(where: str, unit: str, agg: str, top_k: int | None = None, threshold: float | None = None
                    ) -> None:
    """Raise ValueError naming ``where.KEY`` (or ``KEY`` when ``where`` is '') on a bad selection setting (the
    amounts' ranges are declared on the fields: ``keep``, ``top_k``, ``threshold``)."""
    def key(name: str) -> str:
        return f"{where}.{name}" if where else name

    check_unit(unit, key("unit"))
    if agg not in AGGS:
        raise ValueError(f"{key('agg')}: expected one of {', '.join(AGGS)}, got {agg!r}")
    if top_k and threshold is not None:
        raise ValueError(f"{key('threshold')}: set top_k or threshold, not both")


def check_guarantee(where: str, max_hallucination: float | None, confidence: float, calibration: str | None,
                    top_k: int | None, threshold: float | None, agg: str, other: bool = False,
                    calibration_default: bool = False, composed: bool = False, keep: float | None = None) -> None:
    """Raise ValueError naming the key on bad guarantee settings (``calibration_default``: a recipe fills it;
    ``composed``: a ``where``/``rank`` is set, which keeps units by more than the one detector's threshold the
    calibration certifies). The guarantee chooses how much to keep: a ``keep``, ``top_k`` or ``threshold`` given
    beside it is refused, wherever the settings come from (flags, ``--config`` YAML, a recipe's select section)."""
    def key(name: str) -> str:
        return f"{where}.{name}" if where else name

    if max_hallucination is None:  # its range and confidence's are declared on the fields
        return
    if not calibration and not calibration_default:
        raise ValueError(f"{key('max_hallucination')}: needs {key('calibration')} (labelled units scored by the "
                         "same detector)")
    if top_k or threshold is not None or keep is not None:
        given = key("top_k") if top_k else key("threshold") if threshold is not None else key("keep")
        raise ValueError(f"{key('max_hallucination')}: the guarantee chooses how much to keep (its certified "
                         f"threshold); drop {given}")
    if agg == "repair":
        raise ValueError(f"{key('max_hallucination')}: not with agg repair (use prune, min, mean or prob)")
    if other:
        raise ValueError(f"{key('max_hallucination')}: not with --random or --per-captioner")
    if composed:
        raise ValueError(f"{key('max_hallucination')}: not with {key('where')}/{key('rank')} (the bound holds for "
                         "units above one detector's threshold, not for a subset chosen by other scores)")


def amount(keep: float | None, top_k: int | None, threshold: float | None) -> dict:
    """The one rule for how much to keep, for the command and recipes alike: ``top_k`` (when > 0) or ``threshold``
    (when set) replaces ``keep`` (None: :data:`DEFAULT_KEEP`); returns select()'s ``keep``/``top_k``/``threshold``."""
    if top_k:
        return {"keep": None, "top_k": top_k, "threshold": None}
    if threshold is not None:
        return {"keep": None, "top_k": None, "threshold": threshold}
    return {"keep": DEFAULT_KEEP if keep is None else keep, "top_k": None, "threshold": None}


__all__ = ["DEFAULT_KEEP", "SelectConfig", "amount", "captioner_field", "check_guarantee", "check_selection", "source_field"]
