"""What a recipe stage is (:class:`Stage`) and what each receives: the run's :class:`Paths`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halsift.corpus.safe_paths import safe_component
from halsift.launch.stage_marker import DONE

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe
    from halsift.launch.recipe_ranks import Ranks


def _always(r: Recipe) -> bool:
    return True


@dataclass(frozen=True)
class Stage:
    """One recipe stage: a module of ``launch/stages/`` defines it as ``STAGE``, ``launch/stages/__init__.py`` lists
    it in run order and ``launch/recipe.py`` runs it.

    ``run(recipe, paths) -> dict`` writes under ``<run_dir>/<name>/`` and returns what its ``_done.json`` records.
    ``inputs`` are the recipe sections (dotted keys) it reads itself: a change in one re-runs it and, through the
    chained :meth:`fingerprint`, every stage after it (what earlier stages made reaches it through that chain)."""

    name: str
    inputs: tuple[str, ...]
    run: Callable[..., dict]
    # under `halsift launch -- run`: run(recipe, paths, ranks) on every rank, each its share (one stage at most:
    # launch/recipe_ranks.py); False: run(recipe, paths) on rank 0 alone
    every_rank: bool = False
    enabled: Callable[[Recipe], bool] = _always  # False: the recipe leaves the stage out (no folder, no _done.json)
    # True: the stage's folder carries no finer identity than the stage's own (one output made from its sections:
    # the base CLIP, the report), so when those changed it is emptied before the stage runs again. Every other
    # stage runs again over its folder and keeps what still holds by its own identity (score parts, selections...)
    clears: bool = False

    def fingerprint(self, recipe: dict, previous: str) -> dict:
        """``{"fingerprint", "sections"}``: a hash per input section of ``recipe`` (the recipe as a dict), and one
        over those and ``previous`` (the fingerprint of the stage before, '' for the first)."""
        sections = {k: _sha(fingerprinted(k, _lookup(recipe, k))) for k in self.inputs}
        return {"fingerprint": _sha([previous, sections]), "sections": sections}

    def execute(self, r: Recipe, p: Paths, ranks: Ranks | None = None) -> dict:
        """Run the stage; ``ranks`` reaches only an ``every_rank`` stage."""
        return self.run(r, p, ranks) if self.every_rank else self.run(r, p)


def fingerprinted(key: str, section):
    """What of a recipe section a fingerprint hashes: without the settings that change only how a stage runs
    (``recipe_config.FINGERPRINT_OMITS``), and without settings added later while at their default
    (``FINGERPRINT_SINCE``)."""
    from halsift.launch.recipe_config import FINGERPRINT_OMITS, FINGERPRINT_SINCE

    if not isinstance(section, dict) or (key not in FINGERPRINT_OMITS and key not in FINGERPRINT_SINCE):
        return section
    since = FINGERPRINT_SINCE.get(key, {})
    return {k: v for k, v in section.items()
            if k not in FINGERPRINT_OMITS.get(key, ()) and not (k in since and v == since[k])}


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _lookup(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


@dataclass
class Paths:
    """Where each stage reads and writes, resolved once from the recipe."""

    run: Path
    corpus: str
    bench: str
    retrieval: dict[str, str]
    pretrain_data: str
    base: str  # base CLIP weights (pretrained tag or file), '' until the pretrain stage has run
    source_corpus: str = ""  # the corpus as given; ``corpus`` is its decontaminated copy when the dedup stage runs

    def stage(self, name: str) -> Path:
        return self.run / name

    def named(self, stage: str, name: str) -> Path:
        """``<run>/<stage>/<name>`` for a recipe name (a detector, ensemble, variant): refused unless ``name`` is one
        safe path component, so no recipe builds a path outside the run folder (the config checks it first)."""
        return self.stage(stage) / safe_component(name, stage)


def resolve_paths(r: Recipe) -> Paths:
    run = Path(r.run_dir)
    world = run / "world"
    corpus = r.data.corpus or (str(world / "corpus") if r.world.enabled else "")
    bench = r.data.bench or (str(world / "bench" / "bench.jsonl") if r.world.enabled else "")
    retrieval = dict(r.data.retrieval) or ({"synthetic": str(world / "retrieval")} if r.world.enabled else {})
    pretrain = r.data.pretrain or (str(world / "pretrain") if r.world.enabled else "")
    base = r.model.pretrained or str(run / "pretrain" / "final" / "open_clip_model.safetensors")
    source = corpus
    # the dedup stage's copy without leaks and duplicates, when this run makes it or an earlier run made it (a run
    # listing only later stages reads what they were made from)
    if corpus and r.dedup.enabled and ("dedup" in r.stages or (run / "dedup" / DONE).is_file()):
        corpus = str(run / "dedup" / "corpus")
    return Paths(run, corpus, bench, retrieval, pretrain, base, source)
