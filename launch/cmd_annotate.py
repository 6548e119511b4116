"""``halsift annotate``: draw corpus sentences for labelling (stratified by score, weights recorded), write a static
labelling page, and let its exported labels feed ``score`` and ``select --calibration``."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from halsift.corpus.config import config_from_args, field
from halsift.launch.describe import config_arguments

HELP = "draw a score-stratified sample of the corpus for labelling and write a keyboard labelling page (HTML)"


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


CONFIG = AnnotateConfig  # the settings (docs/config.md, --describe)

add_arguments = config_arguments(AnnotateConfig, config_file=False, defaults=True)


RECORD = "annotate.json"  # the folder's run record (halsift.execution.run_folder): what drew the sample, and how it ended


def identity(cfg: AnnotateConfig) -> dict:
    """What the sample is drawn from: the score folder (its manifest's content: the parts it records), the shards,
    and the draw's settings."""
    from pathlib import Path

    from halsift.execution.run_folder import content
    from halsift.corpus.shards import expand_shards

    manifest = Path(cfg.scores) / "_manifest.json"
    return {"stage": "annotate", "scores": str(Path(cfg.scores).resolve()),
            "scores_fp": content(manifest)["hash"] if manifest.is_file() else None,
            "inputs": [str(Path(x).resolve()) for x in expand_shards(cfg.data)],
            "settings": {"n": cfg.n, "seed": cfg.seed, "detector": cfg.detector}}


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from halsift.execution.run_folder import check_or_start, failing
    from halsift.corpus.shards import write_json_atomic
    from halsift.launch.cli import UsageError

    cfg = config_from_args(AnnotateConfig, args)
    out = Path(cfg.out)
    ident = identity(cfg)
    hint = "choose a new --out folder (a page there may hold labels in a browser)"
    old = check_or_start(out, ident, keys=("stage", "scores", "scores_fp", "inputs"),
                         what="another annotation sample", manifest=RECORD, error=UsageError, parts_glob="",
                         start=False, hint=hint, prefix="--out: ")
    if old is None and out.exists() and any(not p.name.startswith(".") for p in out.iterdir()):
        raise UsageError(f"--out: {out} is not empty and holds no {RECORD}; {hint}")
    if old is not None and old.get("status") == "complete":  # the same draw: the page and any saved labels stay
        print(f"{out}: this sample is drawn already ({old['drawn']} sentences, {out / 'index.html'}); labels.jsonl "
              "there is kept", flush=True)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / RECORD, {**ident, "status": "running"})
    with failing(out, RECORD):
        rows = build_sample(cfg)
        from halsift.eval.report.annotate_page import write_annotate_page

        path = write_annotate_page(out, rows)
    write_json_atomic(out / RECORD, {**ident, "status": "complete", "drawn": len(rows)})
    print(f"drew {len(rows)} sentences -> {path}: mark them (j/k, y/n), Export, save labels.jsonl in {out}; then "
          f"`halsift select ... --calibration {out}/labels.jsonl`")
    return 0


def build_sample(cfg: AnnotateConfig) -> list[dict]:
    """Draw the sample, copy its images under ``out/images`` and write ``sample.jsonl`` / ``design.json``; returns
    the page's rows (bench rows without labels, each with its caption's ``_context``)."""
    from pathlib import Path

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
        from halsift.launch.cli import UsageError

        raise UsageError(f"--data: none of the drawn keys is in {cfg.data} (scores of other shards?)")
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
