"""Distillation (``halsift train detector --teacher SCORES --embeddings EMB --out DIR``, issue 44): a cheap student
head on stored CLIP embeddings trained on a judge's scores, no human labels.

The teacher is a score folder of the judge on a uniform sample of the corpus (``select --random`` then ``score``; a
cascade's ``_stages/sample`` folder holds placeholder scores for the units it did not sample, so it is no teacher);
its units' image and sentence vectors come from a ``halsift embed`` folder of the same shards. The head
(:func:`halsift.filtering.detectors.student.head` on ``[image, text, image * text, cosine]``) is fitted to the
teacher's score / 100 with a soft-target logistic loss; a tenth of the units (by hash) is held out, and the step
with the lowest held-out loss is kept. Writes ``DIR/student/`` (``model.safetensors``, ``config.json``), the detector
``student:path=DIR/student,embeddings=EMB``, and ``DIR/distill.json``, the run record (teacher, embeddings and
settings: the same command finds its student, another run into the folder is refused).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from halsift.corpus.errors import InputError


def teacher_units(teacher: str | os.PathLike, embeddings: str | os.PathLike, sample: int = 0, seed: int = 0
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(features, targets 0-1, held-out mask, embedding model) of the teacher's scored units that have vectors."""
    from halsift.corpus.embedding_store import IMAGE, read_embeddings, read_manifest
    from halsift.corpus.scores import read_scores
    from halsift.filtering.detectors.baselines import hash_uniform
    from halsift.filtering.detectors.student import features

    t = read_scores(teacher, ["key", "sentence_index", "score"])
    keys, idx = t["key"].to_pylist(), t["sentence_index"].to_pylist()
    score = t["score"].to_numpy().astype(np.float64)
    if sample and sample < len(keys):
        pick = np.sort(np.random.default_rng(seed).choice(len(keys), sample, replace=False))
        keys, idx, score = [keys[i] for i in pick], [idx[i] for i in pick], score[pick]
    model = read_manifest(embeddings)["model"]
    img = read_embeddings(embeddings, IMAGE)
    txt = read_embeddings(embeddings, None)
    by_img = {k: v for k, v in zip(img.keys, img.vectors)}
    by_txt = {(k, int(i)): v for k, i, v in zip(txt.keys, txt.sentence_index, txt.vectors) if i >= 0}
    rows = [j for j, (k, i) in enumerate(zip(keys, idx)) if k in by_img and (k, int(i)) in by_txt]
    if len(rows) < 10:
        raise InputError(f"--teacher {teacher}: {len(rows)} of its {len(keys)} units have vectors in --embeddings "
                         f"{embeddings} (embed the shards the teacher scored)")
    x = features(np.stack([by_img[keys[j]] for j in rows]), np.stack([by_txt[(keys[j], int(idx[j]))] for j in rows]))
    held = np.array([hash_uniform(seed, "distill\x00" + keys[j], int(idx[j])) < 0.1 for j in rows])
    return x, score[rows] / 100.0, held, model


RECORD = "distill.json"  # the run record of a distillation's --out (halsift.execution.run_folder): what taught it


class DistillError(InputError):
    """A distillation that cannot run as asked (one line naming the flag or folder)."""


def identity(teacher: str | os.PathLike, embeddings: str | os.PathLike, settings: dict) -> dict:
    """What a student is made from: the teacher's and the embeddings' parts by content (a copied folder, or one
    scored or embedded again to the same parts, is the same teacher; their paths are recorded, not compared) and
    the training settings."""
    from halsift.execution.run_folder import content_digest

    return {"stage": "distill", "teacher": str(Path(teacher).resolve()), "teacher_fp": content_digest(teacher),
            "embeddings": str(Path(embeddings).resolve()), "embeddings_fp": content_digest(embeddings),
            "settings": settings}


def check_teacher(teacher: str | os.PathLike, embeddings: str | os.PathLike) -> None:
    """Refuse, in one line naming both, a teacher that is not a finished score folder of a corpus (a cascade's stage
    folder, placeholders included, or an unfinished one: the reader's own check,
    :func:`~halsift.filtering.selection.score_folder.check_score_folder`) or whose shards are not the shards the
    embeddings were made from (each shard's content, as both folders record it, compared part by part: the same key
    in another corpus names another sample)."""
    from halsift.corpus.embedding_store import part_meta
    from halsift.filtering.selection.score_folder import SelectError, check_score_folder, part_stats_of

    try:
        folder = check_score_folder(teacher)
    except (SelectError, FileNotFoundError) as e:
        raise DistillError(f"--teacher: {str(e).removeprefix('scores: ')}") from None
    for part in folder.parts:
        vectors = Path(embeddings) / part.name
        if not vectors.is_file():
            continue
        meta = part_meta(vectors)
        a, b = part_stats_of(part).get("source_fp") or {}, meta.get("source_fp") or {}
        if "hash" in a and "hash" in b and not _same_shard(a, b, meta.get("source")):
            raise DistillError(f"--embeddings: {vectors} was made from another shard than --teacher {part} was scored "
                               f"from ({a.get('source') or part.name}: their content differs); embed the shards the "
                               "teacher scored")


def _same_shard(a: dict, b: dict, shard: str | None) -> bool:
    """Whether two recorded fingerprints of a shard say the same content. Made the same way (sampled blocks, or the
    whole file with ``score --full-hash``), they are compared; made two ways, each is checked against the shard as it
    is now, made its own way (:func:`~halsift.corpus.fingerprint.refingerprint`), and with the shard gone only the
    sizes can be compared (no refusal on what cannot be seen)."""
    from halsift.corpus.fingerprint import refingerprint

    if a.get("size") != b.get("size"):
        return False
    if bool(a.get("full")) == bool(b.get("full")):
        return a["hash"] == b["hash"]
    if not shard or not Path(shard).is_file():
        return True
    return all(refingerprint(shard, fp)["hash"] == fp["hash"] for fp in (a, b))


def distill(teacher: str | os.PathLike, embeddings: str | os.PathLike, out: str | os.PathLike, steps: int = 500,
            batch_size: int = 256, lr: float = 1e-3, hidden: int = 64, sample: int = 0, seed: int = 0) -> dict:
    """Train the student (module docstring) into ``out``, keeping the run record :data:`RECORD` like every stage:
    the same command again finds its student (returned, ``trained_already``), another teacher, embeddings or
    settings is refused in one line, and so is an ``out`` holding anything else (another student made before the
    record). Returns the student's ``config.json`` (with ``spec`` and held-out metrics)."""
    from halsift.execution.run_folder import check_or_start, failing
    from halsift.corpus.shards import write_json_atomic

    out = Path(out)
    check_teacher(teacher, embeddings)  # who made the inputs, and from what: before anything is written
    settings = {"steps": steps, "batch_size": batch_size, "lr": lr, "hidden": hidden, "sample": sample, "seed": seed}
    ident = identity(teacher, embeddings, settings)
    hint = "choose a new --out folder"
    old = check_or_start(out, ident, keys=("stage", "teacher_fp", "embeddings_fp"), what="another student",
                         manifest=RECORD, error=DistillError, parts_glob="", start=False, hint=hint, prefix="--out: ")
    if old is None and out.is_dir() and any(not p.name.startswith(".") for p in out.iterdir()):
        raise DistillError(f"--out: {out} is not empty and holds no {RECORD} (another student, or another run's "
                           f"folder); {hint}")
    student = out / "student" / "config.json"
    if old is not None and old.get("status") == "complete" and student.is_file():
        return {**json.loads(student.read_text()), "trained_already": True}
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / RECORD, {**ident, "status": "running"})
    with failing(out, RECORD):
        cfg = _train_student(teacher, embeddings, out, **settings)
    write_json_atomic(out / RECORD, {**ident, "status": "complete", "spec": cfg["spec"]})
    return cfg


def _train_student(teacher: str | os.PathLike, embeddings: str | os.PathLike, out: str | os.PathLike, steps: int,
                   batch_size: int, lr: float, hidden: int, sample: int, seed: int) -> dict:
    """The training itself: ``out/student/`` (``model.safetensors``, ``config.json``); returns the config."""
    import torch
    from safetensors.torch import save_file
    from scipy.stats import spearmanr

    from halsift.corpus.shards import write_json_atomic
    from halsift.filtering.detectors.student import FORMAT, head

    x, y, held, model_id = teacher_units(teacher, embeddings, sample, seed)
    torch.manual_seed(seed)
    net = head((x.shape[1] - 1) // 3, hidden)
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype(np.float32))
    tr, va = np.flatnonzero(~held), np.flatnonzero(held)
    if not len(va):
        va = tr
    loss_fn = torch.nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(seed)
    best, best_state, best_step = float("inf"), None, 0
    for step in range(1, steps + 1):
        b = torch.from_numpy(rng.choice(tr, min(batch_size, len(tr)), replace=False))
        net.train()
        loss = loss_fn(net(xt[b])[:, 0], yt[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == steps:
            net.eval()
            with torch.no_grad():
                v = float(loss_fn(net(xt[va])[:, 0], yt[va]))
            if v < best:
                best, best_step = v, step
                best_state = {k: t.detach().clone() for k, t in net.state_dict().items()}
    net.load_state_dict(best_state)
    with torch.no_grad():
        pred = torch.sigmoid(net(xt[va])[:, 0]).numpy()
    folder = Path(out) / "student"
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(folder / "model.safetensors"))
    cfg = {"format": FORMAT, "dim": (x.shape[1] - 1) // 3, "hidden": hidden, "embeddings_model": model_id,
           "teacher": str(teacher), "embeddings": str(embeddings), "units": int(len(y)), "held_out": int(len(va)),
           "best_step": best_step, "held_out_loss": best,
           "held_out_spearman": float(spearmanr(pred, y[va]).statistic) if len(va) > 2 else None,
           "spec": f"student:path={folder},embeddings={embeddings}"}
    write_json_atomic(folder / "config.json", cfg)
    return cfg
