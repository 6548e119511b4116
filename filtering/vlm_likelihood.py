"""Likelihood analysis (HalDec-Bench Fig. 7): how well does the judge's language model predict each caption
sentence given its own image vs a random other image, by sentence position?

The model is prompted to describe the image (``Describe this image in detail.``), the assistant turn holds the
caption's preceding sentences, and the sentence's mean token log-likelihood is read off one forward pass.
A large own-vs-random gap means the sentence is grounded in the image; a gap that shrinks with the position
reproduces the paper's finding that later sentences lean on the language prior.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from halsift.filtering.base import Item

DESCRIBE_PROMPT = "Describe this image in detail."


def sentence_logliks(det, items: Sequence[Item], batch_size: int = 16) -> list[float]:
    """Mean log-probability (nats/token) of each item's sentence given its image and preceding sentences.

    ``det`` is a :class:`~halsift.filtering.vlm_detector.VlmDetector` (any mode; only its model and processor
    are used).
    """
    import torch

    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": DESCRIBE_PROMPT}]}]
    head = det.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    tok = det.tokenizer
    out: list[float] = []
    cache: dict[int, dict] = {}
    for s in range(0, len(items), batch_size):
        chunk = list(items[s:s + batch_size])
        prefixes, conts, n_sent = [], [], []
        for it in chunk:
            if id(it.image) not in cache:
                cache[id(it.image)] = dict(det.processor(text=[head], images=[it.image], return_tensors="pt",
                                                         add_special_tokens=False))
            prefixes.append(cache[id(it.image)])
            ctx = (tok(" ".join(c.strip() for c in it.context), add_special_tokens=False)["input_ids"]
                   if it.context else [])
            sent = tok((" " if it.context else "") + it.sentence.strip(), add_special_tokens=False)["input_ids"]
            conts.append(ctx + sent)
            n_sent.append(len(sent))
        batch = det.full_batch(prefixes, conts)
        keep = max(n_sent) + 1
        with torch.inference_mode():
            logp = det.model(**batch, use_cache=False, logits_to_keep=keep).logits.float().log_softmax(-1)
        ids = batch["input_ids"]
        for r, n in enumerate(n_sent):
            # logits at column j predict token j+1; the sentence is the last n tokens of the (left-padded) row
            pred = logp[r, keep - 1 - n:keep - 1]
            target = ids[r, ids.shape[1] - n:]
            out.append(float(pred.gather(-1, target.view(-1, 1)).mean()))
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


__all__ = ["DESCRIBE_PROMPT", "image_key", "own_vs_random", "sentence_logliks", "with_random_images"]
