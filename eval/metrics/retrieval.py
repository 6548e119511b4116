"""Image–text retrieval recall (DESIGN.md, "Metrics"): R@k in both directions with several captions per image.

Image→text (``i2t``): an image query is a hit at k if ANY of its captions is among the k most similar texts.
Text→image (``t2i``): every caption is a query; a hit at k if its own image is among the k most similar images.
Values are on a 0–100 scale, like the papers (CLIP, ALIGN, COCO/Flickr Karpathy-split evaluations).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np

from halsift.corpus.atomic import atomic_file
from halsift.corpus.retrieval import read_retrieval

_CHUNK = 1024  # rows of the similarity matrix computed at once (bounded memory on 5k x 25k COCO)
NO_CAPTION_RANK = np.iinfo(np.int64).max  # i2t rank of an image without captions (never a hit, left out of R@k)


def retrieval_ranks(image_emb, text_emb, text_to_image) -> tuple[np.ndarray, np.ndarray]:
    """Per-query ranks (0 = first) from embeddings (cosine similarity; rows are normalised here).

    ``image_emb``: (n_images, d); ``text_emb``: (n_texts, d); ``text_to_image[j]`` is the image index of caption
    ``j``. Returns ``(i2t_rank, t2i_rank)``: per image, the rank of its best-ranked caption (``NO_CAPTION_RANK``
    for an image without captions); per caption, the rank of its own image. A query is a hit at k when its rank is
    ``< k``. Ties count against the query (a competitor with an equal score ranks ahead).
    """
    img = _normalise(np.asarray(image_emb, dtype=np.float64), "image_emb")
    txt = _normalise(np.asarray(text_emb, dtype=np.float64), "text_emb")
    t2i = np.asarray(text_to_image, dtype=np.int64).reshape(-1)
    n_img, n_txt = len(img), len(txt)
    if img.shape[1] != txt.shape[1]:
        raise ValueError(f"image_emb has dim {img.shape[1]} but text_emb has dim {txt.shape[1]}")
    if len(t2i) != n_txt:
        raise ValueError(f"text_to_image has {len(t2i)} entries, expected one per text ({n_txt})")
    if n_txt and (t2i.min() < 0 or t2i.max() >= n_img):
        raise ValueError(f"text_to_image values must be image indices in [0, {n_img}), got "
                         f"[{t2i.min()}, {t2i.max()}]")
    # i2t: rank of the best-ranked correct caption = number of texts scoring strictly higher than it, plus the
    # number of *wrong* texts tying with it (ties count against the query).
    i2t_rank = np.full(n_img, NO_CAPTION_RANK, dtype=np.int64)
    for lo in range(0, n_img, _CHUNK):
        sim = img[lo:lo + _CHUNK] @ txt.T  # (b, n_txt)
        own = t2i[None, :] == np.arange(lo, lo + len(sim))[:, None]
        best = np.where(own, sim, -np.inf).max(axis=1)
        higher = (sim > best[:, None]).sum(axis=1)
        ties = ((sim == best[:, None]) & ~own).sum(axis=1)
        i2t_rank[lo:lo + len(sim)] = np.where(own.any(axis=1), higher + ties, NO_CAPTION_RANK)
    # t2i: rank of the caption's own image among all images.
    t2i_rank = np.empty(n_txt, dtype=np.int64)
    for lo in range(0, n_txt, _CHUNK):
        sim = txt[lo:lo + _CHUNK] @ img.T  # (b, n_img)
        rows = np.arange(len(sim))
        own = sim[rows, t2i[lo:lo + len(sim)]]
        ge = (sim >= own[:, None]).sum(axis=1) - 1  # minus the own image itself
        t2i_rank[lo:lo + len(sim)] = ge
    return i2t_rank, t2i_rank


def recall_at_k(image_emb, text_emb, text_to_image, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """R@k for ``i2t`` and ``t2i`` from embeddings, via :func:`retrieval_ranks`.

    Returns ``{"i2t/r@1": ..., "t2i/r@1": ..., ...}`` on a 0–100 scale; images without captions are left out of
    ``i2t``. Ties count against the query, so a constant model scores ~0, not 100.
    """
    return recall_from_ranks(*retrieval_ranks(image_emb, text_emb, text_to_image), ks)


def recall_from_ranks(i2t_rank: np.ndarray, t2i_rank: np.ndarray, ks: Sequence[int] = (1, 5, 10)
                      ) -> dict[str, float]:
    """R@k (0–100) and the mean over ``ks`` from the ranks of :func:`retrieval_ranks`."""
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    i2t_rank, t2i_rank = np.asarray(i2t_rank), np.asarray(t2i_rank)
    i2t_rank = i2t_rank[i2t_rank != NO_CAPTION_RANK]
    out: dict[str, float] = {}
    for k in ks:
        out[f"i2t/r@{k}"] = 100.0 * float((i2t_rank < k).mean()) if i2t_rank.size else 0.0
        out[f"t2i/r@{k}"] = 100.0 * float((t2i_rank < k).mean()) if t2i_rank.size else 0.0
    out["i2t/mean_r"] = float(np.mean([out[f"i2t/r@{k}"] for k in ks]))
    out["t2i/mean_r"] = float(np.mean([out[f"t2i/r@{k}"] for k in ks]))
    return out


def clip_benchmark_result(metrics: dict, dataset: str, model: str, pretrained: str) -> dict:
    """Our R@k as a CLIP_benchmark ``zeroshot_retrieval`` result (what ``clip_benchmark eval --output`` writes and
    ``clip_benchmark build`` aggregates): ``image_retrieval_recall@k`` is text->image (our ``t2i``),
    ``text_retrieval_recall@k`` image->text (our ``i2t``), on CLIP_benchmark's 0-1 scale. The recall
    definitions are the same (an image query hits if any of its captions is in the top k)."""
    ks = sorted({int(k.split("@")[1]) for k in metrics if k.startswith(("i2t/r@", "t2i/r@"))})
    out = {}
    for k in ks:
        out[f"image_retrieval_recall@{k}"] = metrics[f"t2i/r@{k}"] / 100.0
        out[f"text_retrieval_recall@{k}"] = metrics[f"i2t/r@{k}"] / 100.0
    return {"dataset": dataset, "model": model, "pretrained": "random-init" if pretrained in ("", "random") else pretrained,
            "task": "zeroshot_retrieval", "metrics": out, "language": "en"}


def write_clip_benchmark(path: str | os.PathLike, metrics: dict, dataset: str, model: str, pretrained: str) -> None:
    """Write :func:`clip_benchmark_result` as JSON (atomic), creating the folder."""
    from halsift.corpus.shards import write_json_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, clip_benchmark_result(metrics, dataset, model, pretrained), indent=None)


def retrieval_set_name(data: str | os.PathLike) -> str:
    """A retrieval set's name for reports: its folder's name when given ``retrieval.jsonl`` or a folder."""
    p = Path(data)
    name = p.parent.name if p.suffix == ".jsonl" and p.stem == "retrieval" else p.stem if p.suffix else p.name
    return name or "retrieval"


def ranks_key(model: str, seed_index: int, set_name: str, direction: str) -> str:
    """Name of one model's per-query ranks in ``retrieval_ranks.npz``: ``<model>/<seed_index>/<set>/<i2t|t2i>``.

    The set's caption -> image map is stored once, as ``<set>/text_to_image``."""
    return f"{model}/{seed_index}/{set_name}/{direction}"


def write_ranks(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """Write named rank arrays to an ``.npz`` atomically (plain arrays, no pickles)."""
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        np.savez_compressed(f, **{k: np.asarray(v) for k, v in arrays.items()})


def read_ranks(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of :func:`write_ranks` (loaded with ``allow_pickle=False``)."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _normalise(x: np.ndarray, name: str) -> np.ndarray:
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array (n, dim), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name}: contains NaN or inf")
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


PRECISIONS = ("auto", "bf16", "fp32")


def use_bf16(precision: str, device) -> bool:
    """The one precision rule of retrieval evaluation (``eval retrieval``, training's in-loop eval, recipes):
    ``auto`` is bf16 autocast on a GPU and fp32 on a CPU, as training's ``precision`` setting reads it."""
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision == "bf16" or (precision == "auto" and torch.device(device).type == "cuda")


def evaluate_retrieval(model, preprocess, tokenizer, retrieval_set: str | os.PathLike, device="cpu",
                       batch_size: int = 64, ks: Sequence[int] = (1, 5, 10), return_ranks: bool = False,
                       precision: str = "auto") -> dict[str, float] | tuple[dict[str, float], dict[str, np.ndarray]]:
    """Encode the retrieval set's images and captions with an open_clip ``model`` and return :func:`recall_at_k`.

    ``retrieval_set``: ``retrieval.jsonl`` or its folder, read by ``halsift.corpus.retrieval.read_retrieval``.
    Unreadable images are an error naming the file: an evaluation set must be complete. Adds ``retrieval/images`` and
    ``retrieval/captions`` counts. With ``return_ranks``, returns ``(metrics, ranks)`` where ``ranks`` holds the
    per-query ``i2t`` and ``t2i`` ranks of :func:`retrieval_ranks` and the ``text_to_image`` map.
    """
    import torch

    from halsift.corpus.images import ImageDecodeError, load_image_file
    from halsift.eval.preprocess_memo import preprocessed
    from halsift.corpus.retrieval import RetrievalFormatError
    from halsift.filtering.models.clip_models import encode_text

    rs = read_retrieval(retrieval_set)
    captions, t2i = rs.flat_captions()
    was_training = model.training
    model.eval()
    img_feats, txt_feats = [], []
    bf16 = use_bf16(precision, device)
    try:
        with torch.inference_mode(), torch.autocast(torch.device(device).type, torch.bfloat16, enabled=bf16):
            for lo in range(0, len(rs), batch_size):
                ims = []
                for p in rs.images[lo:lo + batch_size]:
                    try:
                        ims.append(preprocessed(preprocess, p, partial(load_image_file, p)))
                    except ImageDecodeError as e:
                        raise RetrievalFormatError(f"retrieval set: cannot read image {p} ({e.reason})") from e
                x = torch.stack(ims).to(device)
                img_feats.append(model.encode_image(x).float().cpu())
            for lo in range(0, len(captions), batch_size):
                toks = tokenizer(captions[lo:lo + batch_size]).to(device)
                txt_feats.append(encode_text(model, toks).float().cpu())
    finally:
        model.train(was_training)
    t2i = np.asarray(t2i, dtype=np.int64)
    i2t_rank, t2i_rank = retrieval_ranks(torch.cat(img_feats).numpy(), torch.cat(txt_feats).numpy(), t2i)
    out = recall_from_ranks(i2t_rank, t2i_rank, ks)
    out["retrieval/images"] = float(len(rs))
    out["retrieval/captions"] = float(len(captions))
    if return_ranks:
        return out, {"i2t": i2t_rank, "t2i": t2i_rank, "text_to_image": t2i}
    return out
