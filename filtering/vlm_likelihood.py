"""Likelihood analysis (HalDec-Bench Fig. 7): how well does the judge's language model predict each caption
sentence given its own image vs a random other image, by sentence position?

The model is prompted to describe the image (``Describe this image in detail.``), the assistant turn holds the
caption's preceding sentences, and the sentence's mean token log-likelihood is read off one forward pass.
A large own-vs-random gap means the sentence is grounded in the image; a gap that shrinks with the position
reproduces the paper's finding that later sentences lean on the language prior.

The same per-token log-probabilities give :func:`image_pmi`, the ``vlm`` detector's ``mode=pmi`` score: how much
more likely a captioner finds the sentence under its own image than under fixed reference images.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from halsift.filtering.base import Item

DESCRIBE_PROMPT = "Describe this image in detail."


def describe_prefix(processor, image) -> dict:
    """Processor features of the ``[image, DESCRIBE_PROMPT]`` user turn and the assistant header, on CPU."""
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": DESCRIBE_PROMPT}]}]
    head = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return dict(processor(text=[head], images=[image], return_tensors="pt", add_special_tokens=False))


def _sentence_ids(tok, text: str, first: bool) -> list[int]:
    return tok(("" if first else " ") + text.strip(), add_special_tokens=False)["input_ids"]


def _chains(items: Sequence[Item], prefixes: Sequence[dict]) -> list[tuple[dict, list[str], list[tuple[int, int]]]]:
    """Group items into captions read in one pass: ``(prefix, sentences, [(item index, sentence position)])``.

    Items with the same image and prefix whose preceding sentences + sentence begin another item's (bench rows
    of one caption have distinct keys, so the text decides) share that item's sequence; longest first, so each
    caption becomes one chain however its sentences are ordered or split across batches.
    """
    groups: dict[tuple, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault((it.image_id, id(it.image), id(prefixes[i])), []).append(i)
    chains: list[tuple[dict, list[str], list[tuple[int, int]]]] = []
    for idx in groups.values():
        mine: list[tuple[dict, list[str], list[tuple[int, int]]]] = []
        for i in sorted(idx, key=lambda i: -len(items[i].context)):
            sents = [c.strip() for c in items[i].context] + [items[i].sentence.strip()]
            home = next((c for c in mine if c[1][:len(sents)] == sents), None)
            if home is None:
                home = (prefixes[i], sents, [])
                mine.append(home)
            home[2].append((i, len(sents) - 1))
        chains += mine
    return chains


def _chain_ids(tok, chunk) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
    """Token ids of each chain's sentences, concatenated, and each sentence's ``(start, end)`` in them."""
    conts, spans = [], []
    for _, sents, _ in chunk:
        ids, bounds = [], []
        for k, text in enumerate(sents):
            piece = _sentence_ids(tok, text, k == 0)
            bounds.append((len(ids), len(ids) + len(piece)))
            ids += piece
        conts.append(ids)
        spans.append(bounds)
    return conts, spans


def token_logprobs(det, items: Sequence[Item], prefixes: Sequence[dict], batch_size: int = 16) -> list:
    """Log-probability (nats) of each token of each item's sentence after ``prefixes[i]`` (a
    :func:`describe_prefix`) and the item's preceding sentences; a list of 1-D float numpy arrays.

    Sentences are tokenized one by one (the first bare, the others after a space) and concatenated. The sentences
    of one caption (same key, image and prefix; nested contexts) are read off a single forward pass over the
    caption: a caption of n sentences costs one sequence, not n. ``det`` is a
    :class:`~halsift.filtering.vlm_detector.VlmDetector` (only its model, tokenizer and batch builder are used).
    """
    import torch

    out: list = [None] * len(items)
    chains = _chains(items, prefixes)
    for s in range(0, len(chains), batch_size):
        chunk = chains[s:s + batch_size]
        conts, spans = _chain_ids(det.tokenizer, chunk)
        batch = det.full_batch([c[0] for c in chunk], conts)
        keep = max(len(c) for c in conts) + 1
        with torch.inference_mode():
            logits = det.model(**batch, use_cache=False, logits_to_keep=keep).logits
        ids = batch["input_ids"]
        for r, ((_, _, members), cont, bounds) in enumerate(zip(chunk, conts, spans)):
            # logits column j predicts token j+1; the continuation is the last len(cont) tokens of the row
            logp = logits[r, keep - 1 - len(cont):keep - 1].float().log_softmax(-1)
            lp = logp.gather(-1, ids[r, ids.shape[1] - len(cont):].view(-1, 1)).view(-1).cpu().numpy()
            for i, pos in members:
                a, b = bounds[pos]
                out[i] = lp[a:b]
    return out


def _own_prefixes(det, items: Sequence[Item]) -> list[dict]:
    cache: dict[tuple, dict] = {}
    for it in items:
        k = (it.image_id, id(it.image))
        if k not in cache:
            fit = getattr(det, "fit_image", lambda im: im)  # VlmDetector's max_pixels cap
            cache[k] = describe_prefix(det.processor, fit(it.image))
    return [cache[(it.image_id, id(it.image))] for it in items]


def sentence_logliks(det, items: Sequence[Item], batch_size: int = 16) -> list[float]:
    """Mean log-probability (nats/token) of each item's sentence given its image and preceding sentences."""
    return [float(lp.mean()) for lp in token_logprobs(det, items, _own_prefixes(det, items), batch_size)]


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def reference_images(path: str | None, n: int) -> list:
    """The first ``n`` decodable images (RGB) of ``path``: a folder of image files (sorted by name) or of
    WebDataset shards / a shard spec. Raises ``ValueError`` naming the path when it is missing or holds fewer."""
    import os
    from pathlib import Path

    from halsift.corpus.images import ImageDecodeError, SkipCounter, decode_image, decode_sample

    if int(n) < 1:
        raise ValueError(f"n_references={n!r}: expected an integer >= 1")
    if not path:
        raise ValueError("references: expected a folder of images or WebDataset shards, got nothing")
    p = Path(os.fspath(path))
    images: list = []
    files = sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES) if p.is_dir() else []
    if files:
        for f in files:
            try:
                images.append(decode_image(f.read_bytes(), str(f)))
            except ImageDecodeError:
                continue
            if len(images) == n:
                break
    else:
        from halsift.corpus.shards import iter_samples

        skipped = SkipCounter()
        try:
            for sample in iter_samples(p, skipped):
                img = decode_sample(sample, skipped)
                if img is not None:
                    images.append(img)
                if len(images) == n:
                    break
        except FileNotFoundError:
            raise ValueError(f"references={path}: no such folder of images or WebDataset shards") from None
    if len(images) < n:
        raise ValueError(f"references={path}: needs {n} decodable images (n_references), found {len(images)}")
    return images


class EncodedPrefix:
    """A prefix (e.g. a PMI reference image's :func:`describe_prefix`) run through the model once: its KV cache,
    its length and the log-probabilities of the first continuation token. Every caption read after it reuses the
    cache instead of re-encoding the image and re-running the prompt (:func:`cached_token_logprobs`)."""

    def __init__(self, det, prefix: dict) -> None:
        import torch

        feats = {n: v.to(det.device) if not v.is_floating_point() else v.to(det.device, det.model.dtype)
                 for n, v in prefix.items()}
        with torch.inference_mode():
            out = det.model(**feats, use_cache=True, logits_to_keep=1)
        self.cache = out.past_key_values
        self.first = out.logits[0, -1].float().log_softmax(-1)
        self.length = int(feats["input_ids"].shape[1])
        deltas = getattr(getattr(det.model, "model", None), "rope_deltas", None)  # M-RoPE (Qwen2-VL) offset
        self.rope_delta = None if deltas is None else deltas.reshape(-1)[:1].clone()


def cached_token_logprobs(det, items: Sequence[Item], prefix: EncodedPrefix, batch_size: int = 16) -> list:
    """:func:`token_logprobs` of every item after one shared, already encoded prefix: the same numbers (up to
    float rounding) for the price of the continuation tokens alone. Captions are right-padded, so pads follow
    every real token and change nothing before them."""
    import copy

    import torch

    out: list = [None] * len(items)
    chains = _chains(items, [prefix] * len(items))
    for s in range(0, len(chains), batch_size):
        chunk = chains[s:s + batch_size]
        conts, spans = _chain_ids(det.tokenizer, chunk)
        n = max(len(c) for c in conts)
        ids = torch.full((len(chunk), n), det.pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), prefix.length + n), dtype=torch.long)
        mask[:, :prefix.length] = 1
        for r, c in enumerate(conts):
            ids[r, :len(c)] = torch.tensor(c)
            mask[r, prefix.length:prefix.length + len(c)] = 1
        pos = torch.arange(prefix.length, prefix.length + n).expand(len(chunk), -1)
        if prefix.rope_delta is not None:
            pos = (pos + prefix.rope_delta.cpu()).unsqueeze(0).expand(3, -1, -1)
        cache = copy.deepcopy(prefix.cache)  # the forward appends to the cache: the stored one stays the prefix
        cache.reorder_cache(torch.zeros(len(chunk), dtype=torch.long, device=det.device))
        with torch.inference_mode():
            logits = det.model(input_ids=ids.to(det.device), attention_mask=mask.to(det.device),
                               position_ids=pos.to(det.device), past_key_values=cache, use_cache=True).logits
        logp = logits.float().log_softmax(-1)
        for r, ((_, _, members), cont, bounds) in enumerate(zip(chunk, conts, spans)):
            target = torch.tensor(cont, device=det.device)
            # token 0 is predicted by the prefix's last position, token j > 0 by continuation position j - 1
            lp = torch.cat([prefix.first[target[:1]], logp[r, :len(cont) - 1].gather(-1, target[1:, None])[:, 0]])
            lp = lp.cpu().numpy()
            for i, pos_ in members:
                a, b = bounds[pos_]
                out[i] = lp[a:b]
    return out


def image_pmi(det, items: Sequence[Item], references: Sequence, batch_size: int = 16) -> list[float]:
    """Pointwise mutual information of each sentence with its own image, in nats:
    ``sum_t [log p(t | image) - log mean_k p(t | reference_k)]`` over the sentence's tokens (each conditioned on
    the preceding sentences), with ``references`` the :func:`describe_prefix` of K fixed other images.

    Positive: the image makes the sentence likelier than a typical image does (grounded); negative: the sentence
    fits other images better (a hallucination candidate). A caption costs one full forward pass (its own image)
    plus, per reference, a pass over its tokens alone when ``references`` are :class:`EncodedPrefix` (each
    reference's image and prompt encoded once per run), or a full pass when they are plain prefixes.
    """
    import numpy as np

    if not references:
        raise ValueError("image_pmi: needs at least one reference image")
    own = token_logprobs(det, items, _own_prefixes(det, items), batch_size)
    refs = [cached_token_logprobs(det, items, r, batch_size) if isinstance(r, EncodedPrefix)
            else token_logprobs(det, items, [r] * len(items), batch_size) for r in references]
    out = []
    for i, o in enumerate(own):
        marginal = np.logaddexp.reduce(np.stack([r[i] for r in refs]), axis=0) - np.log(len(refs))
        out.append(float((o - marginal).sum()))
    return out


def image_key(it: Item) -> str:
    """An item's image identity: ``image_id`` when set, else its ``key`` (bench rows of one image share it)."""
    return it.image_id or it.key


def with_random_images(items: Sequence[Item], seed: int = 0) -> list[Item]:
    """The items with every image replaced by another image of the set (a seeded derangement over the distinct
    images, so no sentence keeps its own); ``meta["random_image"]`` names the image swapped in."""
    groups = list(dict.fromkeys(image_key(it) for it in items))
    if len(groups) < 2:
        raise ValueError("random images: needs sentences from at least two images")
    image_of: dict[str, object] = {}
    for it in items:
        image_of.setdefault(image_key(it), it.image)
    rng = random.Random(seed)
    perm = groups[:]
    while any(a == b for a, b in zip(groups, perm)):  # a derangement: never the own image
        rng.shuffle(perm)
    swap = dict(zip(groups, perm))
    return [Item(it.key, it.sentence_index, it.sentence, it.context, image_of[swap[image_key(it)]], it.image_id,
                 {**it.meta, "random_image": swap[image_key(it)]}) for it in items]


def own_vs_random(det, items: Sequence[Item], seed: int = 0, batch_size: int = 16) -> dict:
    """Per-position mean log-likelihood given the own image and a random other caption's image.

    Returns flat metrics: ``likelihood/own/pos<k>``, ``likelihood/random/pos<k>``, ``likelihood/gap/pos<k>``
    (own − random) and the same over all positions (``.../all``). Needs items from at least two images
    (:func:`image_key`).
    """
    swapped = with_random_images(items, seed)
    own = sentence_logliks(det, items, batch_size)
    rnd = sentence_logliks(det, swapped, batch_size)
    res: dict[str, float] = {}
    positions = sorted({it.sentence_index for it in items})
    for name, sel in [(f"pos{p}", [i for i, it in enumerate(items) if it.sentence_index == p]) for p in positions] + \
            [("all", list(range(len(items))))]:
        o = sum(own[i] for i in sel) / len(sel)
        r = sum(rnd[i] for i in sel) / len(sel)
        res[f"likelihood/own/{name}"], res[f"likelihood/random/{name}"] = o, r
        res[f"likelihood/gap/{name}"] = o - r
    return res


__all__ = ["DESCRIBE_PROMPT", "EncodedPrefix", "cached_token_logprobs", "describe_prefix", "image_key", "image_pmi",
           "own_vs_random", "reference_images",
           "sentence_logliks", "token_logprobs", "with_random_images"]
