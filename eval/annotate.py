"""``halsift annotate`` as a library call: draw corpus sentences for labelling (stratified by score, weights
recorded), write a static labelling page, and let its exported labels feed ``score`` and ``select --calibration``.

The draw is a job of the execution layer (:class:`AnnotateJob`, one part: the page) behind
:func:`halsift.execution.engines.run_job`. Its folder's record (``annotate.json``: the score folder's manifest by
content, the shards, ``n``/``seed``/``detector``) is checked before anything is drawn: the same draw again keeps the
page and any saved ``labels.jsonl``; another draw into the folder is refused in one line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from halsift.corpus.config import field
from halsift.corpus.errors import InputError
from halsift.execution.job import Job, Maker, Outcome, Place, Work
from halsift.execution.run_folder import RunFolder
from halsift.execution.stage_job import StagePart

RECORD = "annotate.json"  # the folder's run record: what drew the sample, and how it ended
PAGE = "index.html"
HINT = "choose a new --out folder (a page there may hold labels in a browser)"


class AnnotateError(InputError):
    """An annotation sample that cannot be drawn as asked (one line)."""


@dataclass
class AnnotateConfig:
    """``halsift annotate``'s settings."""

    scores: str = field("", help="score folder of the corpus (`halsift score`)", cli={"required": True})
    data: str = field("", help="the shards that were scored (folder / glob / brace pattern)", cli={"required": True})
    out: str = field("", help="new folder: index.html (the page), images/, sample.jsonl, design.json, annotate.json "
                              "(the run's record: the same command again keeps the page); save the exported "
                              "labels.jsonl here", cli={"required": True})
    n: int = field(300, range="[1, inf)", help="sentences to draw")
    seed: int = field(0, range="[0, inf)", help="seed of the draw")
    detector: str | None = field(None, help="the detector's rows in a score folder of several")


def identity(cfg: AnnotateConfig) -> dict:
    """What the sample is drawn from: the score folder (the content of the parts its manifest records, not the
    manifest's own bytes: an identical rescore, whose timings differ, is the same scores), the shards, and the draw's
    settings."""
    from halsift.corpus.shards import expand_shards
    from halsift.execution.run_folder import content_digest

    return {"stage": "annotate", "scores": str(Path(cfg.scores).resolve()), "scores_fp": content_digest(cfg.scores),
            "inputs": [str(Path(x).resolve()) for x in expand_shards(cfg.data)],
            "settings": {"n": cfg.n, "seed": cfg.seed, "detector": cfg.detector}}


def check_provenance(cfg: AnnotateConfig) -> None:
    """The scores are a finished score folder of the corpus (not a pipeline's stage) made from ``cfg.data``'s shards
    (each shard's content against the fingerprint its part records, as select checks it), refused in one line
    naming both before anything is drawn."""
    from halsift.corpus.shards import expand_shards
    from halsift.filtering.selection.score_folder import check_score_folder, check_sources

    folder = check_score_folder(cfg.scores, cfg.detector)
    seen = check_sources(folder, expand_shards(cfg.data))
    if not seen["shards_checked"] and not seen["shards_unrecorded"]:
        raise AnnotateError(f"--scores {cfg.scores}: none of its parts was scored from the shards of --data "
                            f"{cfg.data}; give the shards that were scored")


@dataclass(frozen=True)
class AnnotateJob(Job):
    """The draw as one job: one part (the page), done when the folder's record says this draw is complete."""

    config: AnnotateConfig
    show_progress: bool = False

    kind = "annotate"
    honours = frozenset()

    def open(self, place: Place) -> Work:
        cfg = self.config
        out = Path(cfg.out)
        check_provenance(cfg)
        folder = RunFolder(out, RECORD)
        ident = identity(cfg)
        old = folder.check_or_start(ident, keys=("stage", "scores", "scores_fp", "inputs"),
                                    what="another annotation sample", error=AnnotateError, parts_glob="",
                                    start=False, hint=HINT, prefix="--out: ")
        if old is None and out.exists() and any(not p.name.startswith(".") for p in out.iterdir()):
            raise AnnotateError(f"--out: {out} is not empty and holds no {RECORD}; {HINT}")
        complete = old is not None and old.get("status") == "complete"
        if not complete:  # the record exists, running, from the first moment
            from halsift.corpus.shards import write_json_atomic

            out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(out / RECORD, {**ident, "status": "running"})

        def done(part) -> bool:
            return complete or (folder.status == "complete" and (out / PAGE).is_file())

        def finish(o: Outcome) -> dict:
            return folder.record() or {}

        return Work(folder, [StagePart(PAGE)], done, lambda: _Drawer(cfg, ident, folder), finish)


class _Drawer(Maker):
    def __init__(self, cfg: AnnotateConfig, ident: dict, folder: RunFolder) -> None:
        self.cfg, self.ident, self.folder = cfg, ident, folder

    def make(self, parts, bar, written) -> None:
        from halsift.corpus.shards import write_json_atomic
        from halsift.eval.report.annotate_page import write_annotate_page

        rows = build_sample(self.cfg)
        write_annotate_page(Path(self.cfg.out), rows)
        write_json_atomic(self.folder.path / RECORD, {**self.ident, "status": "complete", "drawn": len(rows)})
        written(PAGE, {"drawn": len(rows)})


def annotate(cfg: AnnotateConfig) -> dict:
    """Draw the sample of ``cfg`` into ``cfg.out`` (or keep the one already drawn there); returns the folder's record
    (``drawn``: the sentences on the page)."""
    from halsift.execution.engines import run_job

    return run_job(AnnotateJob(cfg)).stats


def build_sample(cfg: AnnotateConfig) -> list[dict]:
    """Draw the sample, copy its images under ``out/images`` and write ``sample.jsonl`` / ``design.json``; returns
    the page's rows (bench rows without labels, each with its caption's ``_context``)."""
    from halsift.corpus.bench import GENERATOR_TYPES, write_bench
    from halsift.corpus.images import SkipCounter
    from halsift.corpus.sample import sentences_of
    from halsift.corpus.shards import expand_shards, iter_shard, write_json_atomic
    from halsift.filtering.selection.annotate_sample import draw, read_corpus_scores
    from halsift.filtering.selection.calibration import ANNOTATE_KEY, detector_of

    table = read_corpus_scores(cfg.scores, cfg.detector)
    d = draw(table, cfg.n, cfg.seed)
    det = detector_of(cfg.scores, cfg.detector)
    want: dict[str, list[int]] = {}
    for j, k in enumerate(d.keys):
        want.setdefault(k, []).append(j)
    out = Path(cfg.out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows: list[dict | None] = [None] * len(d.keys)
    for shard in expand_shards(cfg.data):
        for s in iter_shard(shard, SkipCounter()):
            if s.key not in want:
                continue
            texts, _, _ = sentences_of(s.meta, s.caption)
            image = f"images/{s.key}.{s.ext or 'jpg'}"
            (out / image).write_bytes(s.image)
            for j in want.pop(s.key):
                i = d.sentence_index[j]
                if not 0 <= i < len(texts):
                    continue
                source = s.meta.get("source", "i2t")
                rows[j] = {"id": f"{s.key}_s{i}", "image": image, "image_id": str(s.meta.get("image_id", s.key)),
                           "generator": str(s.meta.get("captioner", "")), "domain": "corpus",
                           "generator_type": source if source in GENERATOR_TYPES else "i2t",
                           "caption_id": s.key, "position": i, "sentence": texts[i], "caption": " ".join(texts),
                           "label": "unknown", "types": [], "spans": [], "split": "val",
                           ANNOTATE_KEY: {"detector": det, "scores": str(Path(cfg.scores).resolve()),
                                          "score": d.score[j], "stratum": d.stratum[j], "weight": d.weight[j],
                                          "edges": d.edges, "population": d.population},
                           "_context": texts}
    found = [r for r in rows if r is not None]
    if not found:
        raise AnnotateError(f"--data: none of the drawn keys is in {cfg.data} (scores of other shards?)")
    order = sorted(range(len(found)), key=lambda j: hash_order(found[j]["id"], cfg.seed))  # no score order shown
    found = [found[j] for j in order]
    write_bench(out / "sample.jsonl", [{k: v for k, v in r.items() if k != "_context"} for r in found])
    write_json_atomic(out / "design.json", {"n": len(found), "seed": cfg.seed, "detector": det, "edges": d.edges,
                                            "population": d.population,
                                            "drawn_per_stratum": [d.stratum.count(h) for h in range(len(d.population))]})
    return json.loads(json.dumps(found))


def hash_order(ident: str, seed: int) -> float:
    from halsift.filtering.detectors.baselines import hash_uniform

    return hash_uniform(seed, ident, 0)


__all__ = ["AnnotateConfig", "AnnotateError", "AnnotateJob", "annotate", "build_sample", "identity"]
