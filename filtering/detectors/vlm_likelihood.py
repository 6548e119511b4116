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
from dataclasses import dataclass

from halsift.filtering.detectors.base import Item, image_group, image_key
from halsift.filtering.detectors.vlm_judge import EncodedPrefix, VlmJudge, as_judge, chat_text, text_features

DESCRIBE_PROMPT = "Describe this image in detail."
_PURPOSE = "sentence likelihoods"


def describe_prefix(processor, image) -> dict:
    """Processor features of the ``[image, DESCRIBE_PROMPT]`` user turn and the assistant header, on CPU."""
    return text_features(processor, chat_text(processor, DESCRIBE_PROMPT), image)


def describe_features(judge: VlmJudge, image) -> dict:
    """:func:`describe_prefix` of ``image`` capped to the judge's ``max_pixels``."""
    return judge.features(chat_text(judge.processor, DESCRIBE_PROMPT), image)


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
        groups.setdefault((*image_group(it), id(prefixes[i])), []).append(i)
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


@dataclass
class Chain:
    """One caption read in one pass: its prefix features, the token ids of its sentences (concatenated), each
    sentence's ``(start, end)`` in them, and the ``(item index, sentence position)`` it answers."""

    prefix: dict
    ids: list[int]
    bounds: list[tuple[int, int]]
    members: list[tuple[int, int]]


@dataclass
class ChainPlan:
    """The chains of a batch of ``n`` items: what :func:`token_logprobs` and PMI read; built on CPU (a
    detector's ``prepare`` step), so it can travel from a worker process."""

    chains: list[Chain]
    n: int


def plan_chains(tokenizer, items: Sequence[Item], prefixes: Sequence[dict]) -> ChainPlan:
    """:func:`_chains` of ``items`` with their token ids (sentences tokenized one by one: the first bare, the
    others after a space)."""
    plan = []
    for prefix, sents, members in _chains(items, prefixes):
        ids, bounds = [], []
        for k, text in enumerate(sents):
            piece = _sentence_ids(tokenizer, text, k == 0)
            bounds.append((len(ids), len(ids) + len(piece)))
            ids += piece
        plan.append(Chain(prefix, ids, bounds, members))
    return ChainPlan(plan, len(items))


def _scatter(out: list, chain: Chain, lp) -> None:
    for i, pos in chain.members:
        a, b = chain.bounds[pos]
        out[i] = lp[a:b]


def planned_logprobs(judge: VlmJudge, plan: ChainPlan, batch_size: int = 16, prefix: dict | None = None) -> list:
    """Per-token log-probabilities of every planned item, one full forward pass per chain (after each chain's own
    prefix, or after ``prefix`` for all)."""
    import torch

    out: list = [None] * plan.n
    for s in range(0, len(plan.chains), batch_size):
        chunk = plan.chains[s:s + batch_size]
        conts = [c.ids for c in chunk]
        batch = judge.full_batch([prefix if prefix is not None else c.prefix for c in chunk], conts)
        keep = max(len(c) for c in conts) + 1
        with torch.inference_mode():
            logits = judge.model(**batch, use_cache=False, logits_to_keep=keep).logits
        ids = batch["input_ids"]
        for r, (chain, cont) in enumerate(zip(chunk, conts)):
            # logits column j predicts token j+1; the continuation is the last len(cont) tokens of the row
            logp = logits[r, keep - 1 - len(cont):keep - 1].float().log_softmax(-1)
            _scatter(out, chain, logp.gather(-1, ids[r, ids.shape[1] - len(cont):].view(-1, 1)).view(-1).cpu().numpy())
    return out


def planned_cached_logprobs(judge: VlmJudge, plan: ChainPlan, prefix: EncodedPrefix, batch_size: int = 16) -> list:
    """:func:`planned_logprobs` after one shared, already encoded prefix: the same numbers (up to float rounding)
    for the price of the continuation tokens alone (right-padded: pads follow every real token)."""
    import torch

    out: list = [None] * plan.n
    for s in range(0, len(plan.chains), batch_size):
        chunk = plan.chains[s:s + batch_size]
        logits = judge.continue_prefix(prefix, [0] * len(chunk), [c.ids for c in chunk], mid_pad=False,
                                       keep_prefix=True)
        logp = logits.float().log_softmax(-1)
        for r, chain in enumerate(chunk):
            target = torch.tensor(chain.ids, device=judge.device)
            # token 0 is predicted by the prefix's last position, token j > 0 by continuation position j - 1
            lp = torch.cat([prefix.first[target[:1]], logp[r, :len(chain.ids) - 1].gather(-1, target[1:, None])[:, 0]])
            _scatter(out, chain, lp.cpu().numpy())
    return out


def token_logprobs(judge, items: Sequence[Item], prefixes: Sequence[dict], batch_size: int = 16) -> list:
    """Log-probability (nats) of each token of each item's sentence after ``prefixes[i]`` (a
    :func:`describe_prefix`) and the item's preceding sentences; a list of 1-D float numpy arrays.

    The sentences of one caption (same image and prefix; nested contexts) are read off a single forward pass over
    the caption: a caption of n sentences costs one sequence, not n. ``judge`` is a
    :class:`~halsift.filtering.detectors.vlm_judge.VlmJudge` or a detector that lends one (capability ``vlm-judge``).
    """
    judge = as_judge(judge, _PURPOSE)
    return planned_logprobs(judge, plan_chains(judge.tokenizer, items, prefixes), batch_size)


def own_prefixes(judge: VlmJudge, items: Sequence[Item]) -> list[dict]:
    """Each item's :func:`describe_features` (one per distinct image, :func:`~halsift.filtering.detectors.base.image_group`)."""
    cache: dict[tuple, dict] = {}
    for it in items:
        if image_group(it) not in cache:
            cache[image_group(it)] = describe_features(judge, it.image)
    return [cache[image_group(it)] for it in items]


def sentence_logliks(judge, items: Sequence[Item], batch_size: int = 16) -> list[float]:
    """Mean log-probability (nats/token) of each item's sentence given its image and preceding sentences
    (``judge``: a VlmJudge or a detector that lends one)."""
    judge = as_judge(judge, _PURPOSE)
    return [float(lp.mean()) for lp in token_logprobs(judge, items, own_prefixes(judge, items), batch_size)]


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def reference_images(path: str | None, n: int) -> list:
    """The first ``n`` decodable images (RGB) of ``path``: a folder of image files (sorted by name) or of
    WebDataset shards / a shard spec. Raises ``ValueError`` naming the path when it is missing or holds fewer."""
    import os
    from pathlib import Path

    from halsift.corpus.images import ImageDecodeError, SkipCounter, load_image_file

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
                images.append(load_image_file(f))
            except ImageDecodeError:
                continue
            if len(images) == n:
                break
    else:
        from halsift.corpus.sample import read_samples

        try:
            for sample in read_samples(p, SkipCounter()):
                images.append(sample.image)
                if len(images) == n:
                    break
        except FileNotFoundError:
            raise ValueError(f"references={path}: no such folder of images or WebDataset shards") from None
    if len(images) < n:
        raise ValueError(f"references={path}: needs {n} decodable images (n_references), found {len(images)}")
    return images


def cached_token_logprobs(judge, items: Sequence[Item], prefix: EncodedPrefix, batch_size: int = 16) -> list:
    """:func:`token_logprobs` of every item after one shared, already encoded prefix (an :class:`EncodedPrefix`)."""
    judge = as_judge(judge, _PURPOSE)
    return planned_cached_logprobs(judge, plan_chains(judge.tokenizer, items, [prefix] * len(items)), prefix,
                                   batch_size)


def plan_pmi(judge: VlmJudge, items: Sequence[Item]) -> ChainPlan:
    """The CPU half of :func:`image_pmi`: the items' own-image prefixes and their chains."""
    return plan_chains(judge.tokenizer, items, own_prefixes(judge, items))


def planned_pmi(judge: VlmJudge, plan: ChainPlan, references: Sequence, batch_size: int = 16) -> list[float]:
    """:func:`image_pmi` from a :func:`plan_pmi`."""
    import numpy as np

    if not references:
        raise ValueError("image_pmi: needs at least one reference image")
    own = planned_logprobs(judge, plan, batch_size)
    refs = [planned_cached_logprobs(judge, plan, r, batch_size) if isinstance(r, EncodedPrefix)
            else planned_logprobs(judge, plan, batch_size, prefix=r) for r in references]
    out = []
    for i, o in enumerate(own):
        marginal = np.logaddexp.reduce(np.stack([r[i] for r in refs]), axis=0) - np.log(len(refs))
        out.append(float((o - marginal).sum()))
    return out


def image_pmi(judge, items: Sequence[Item], references: Sequence, batch_size: int = 16) -> list[float]:
    """Pointwise mutual information of each sentence with its own image, in nats:
    ``sum_t [log p(t | image) - log mean_k p(t | reference_k)]`` over the sentence's tokens (each conditioned on
    the preceding sentences), with ``references`` the :func:`describe_prefix` of K fixed other images.

    Positive: the image makes the sentence likelier than a typical image does (grounded); negative: the sentence
    fits other images better (a hallucination candidate). A caption costs one full forward pass (its own image)
    plus, per reference, a pass over its tokens alone when ``references`` are :class:`EncodedPrefix` (each
    reference's image and prompt encoded once per run), or a full pass when they are plain prefixes.
    """
    judge = as_judge(judge, _PURPOSE)
    return planned_pmi(judge, plan_pmi(judge, items), references, batch_size)


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


def own_vs_random(judge, items: Sequence[Item], seed: int = 0, batch_size: int = 16) -> dict:
    """Per-position mean log-likelihood given the own image and a random other caption's image.

    Returns flat metrics: ``likelihood/own/pos<k>``, ``likelihood/random/pos<k>``, ``likelihood/gap/pos<k>``
    (own − random) and the same over all positions (``.../all``). Needs items from at least two images
    (:func:`image_key`).
    """
    swapped = with_random_images(items, seed)
    own = sentence_logliks(judge, items, batch_size)
    rnd = sentence_logliks(judge, swapped, batch_size)
    res: dict[str, float] = {}
    positions = sorted({it.sentence_index for it in items})
    for name, sel in [(f"pos{p}", [i for i, it in enumerate(items) if it.sentence_index == p]) for p in positions] + \
            [("all", list(range(len(items))))]:
        o = sum(own[i] for i in sel) / len(sel)
        r = sum(rnd[i] for i in sel) / len(sel)
        res[f"likelihood/own/{name}"], res[f"likelihood/random/{name}"] = o, r
        res[f"likelihood/gap/{name}"] = o - r
    return res


__all__ = ["DESCRIBE_PROMPT", "Chain", "ChainPlan", "EncodedPrefix", "cached_token_logprobs", "describe_features",
           "describe_prefix", "image_key", "image_pmi", "own_prefixes", "own_vs_random", "plan_chains", "plan_pmi",
           "planned_cached_logprobs", "planned_logprobs", "planned_pmi", "reference_images", "sentence_logliks",
           "token_logprobs", "with_random_images"]
