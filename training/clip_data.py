"""The training stream for ``halsift train clip``: WebDataset shards -> shuffled, decoded, tokenized batches.

Per-rank and per-dataloader-worker splitting, as in open_clip_train:

* **One data spec** (epoch mode): every epoch the whole shard list is shuffled with ``seed + epoch`` (the same
  order on every rank and worker) and global worker ``g = rank * workers + worker`` takes shards ``g::total``,
  so within an epoch no sample is seen twice. Epochs repeat forever; training is bounded by ``steps``. The spec
  needs at least ``world_size * workers`` shards (an error says so otherwise).
* **Several specs** (mixture mode): each global worker resamples shards of every spec with replacement
  (RNG seeded by ``(seed, g)``) and draws each sample's source with probability ∝ ``data_weights``, like
  webdataset's ``ResampledShards`` + ``RandomMix``.

Samples are read by :func:`halsift.corpus.sample.read_shard`, the reader ``halsift score`` uses: training keeps and
skips exactly the samples scoring does (duplicate key, bad json, missing image, empty caption, undecodable image,
truncated shard). Each batch carries what its worker skipped since its previous batch: ``batch["skipped"]`` (a
count) and ``batch["skipped_by_kind"]`` (kind -> count, the kinds of :class:`~halsift.corpus.images.SkipCounter`).

Resume (data position): the stream is a pure function of ``(seed, rank, worker)``. A resumed run rebuilds
the same stream and each worker discards the batches it had already produced (``skip_batches``) before the
image transform and tokenizer run, so it continues exactly where the checkpoint left off, provided world
size, workers and batch size are unchanged (the trainer checks this and otherwise reseeds the stream with
``seed + step``, with a warning). Fast-forwarding costs reading and decoding the skipped samples.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, IterableDataset

from halsift.corpus.images import SkipCounter
from halsift.corpus.sample import read_shard
from halsift.corpus.shards import expand_shards
from halsift.corpus.parent_watch import ExitWithParent


def check_selection_complete(spec: str) -> None:
    """Refuse the output of a ``halsift select`` that did not finish (killed, or failed part-way): its folder
    has a ``manifest.json`` that is not ``complete``, or a ``kept.parquet`` without a manifest."""
    import json

    from halsift.corpus.shards import ShardFormatError

    for folder in sorted({p.parent for p in expand_shards(spec)}):
        manifest = folder / "manifest.json"
        if manifest.is_file():
            try:
                m = json.loads(manifest.read_text())
            except ValueError as e:
                raise ShardFormatError(f"data {folder}: manifest.json is not valid JSON ({e})") from e
            if not isinstance(m, dict):
                continue
            status = m.get("status", "complete" if "kept_units" in m else None)
            if "filter" in m and status != "complete":
                raise ShardFormatError(f"data {folder}: a `halsift select` output whose manifest.json says status "
                                       f"{status!r} (killed or failed); run select again into a new --out")
        elif (folder / "kept.parquet").exists():
            raise ShardFormatError(f"data {folder}: a `halsift select` output without manifest.json (incomplete); "
                                   "run select again into a new --out")


class ShardStream(IterableDataset):
    """Infinite stream of ``{"image": (B,3,H,W), "text": (B,L), "skipped": int}`` batches for one process."""

    def __init__(self, specs: Sequence[str], preprocess: Callable, tokenizer: Callable, batch_size: int,
                 weights: Sequence[float] | None = None, seed: int = 0, shuffle_buffer: int = 256,
                 skip_batches: int = 0, num_workers: int = 1) -> None:
        self.shards = [[str(p) for p in expand_shards(s)] for s in specs]
        self.specs = list(specs)
        self.weights = list(weights) if weights else [1.0] * len(specs)
        self.preprocess, self.tokenizer = preprocess, tokenizer
        self.batch_size, self.seed, self.shuffle_buffer = batch_size, seed, shuffle_buffer
        self.skip_batches = skip_batches  # batches already consumed by this rank (all its workers together)
        self.num_workers = max(1, num_workers)

    # -- shard order -------------------------------------------------------------------------------
    def _epoch_urls(self, g: int, total: int) -> Iterator[str]:
        shards = self.shards[0]
        if len(shards) < total:
            raise ValueError(f"data {self.specs[0]}: {len(shards)} shard(s) cannot be split without duplicates "
                             f"over {total} readers (processes x workers); lower workers or write more shards")
        epoch = 0
        while True:
            order = list(shards)
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            yield from order[g::total]
            epoch += 1

    def _resampled_urls(self, i: int, rng: random.Random) -> Iterator[str]:
        while True:
            yield rng.choice(self.shards[i])

    # -- samples -----------------------------------------------------------------------------------
    def _samples(self, urls: Iterator[str], skipped: SkipCounter, spec: int = 0) -> Iterator[tuple]:
        """Decoded (image, caption) pairs of the valid samples (:func:`~halsift.corpus.sample.read_shard`); the rest
        are counted in ``skipped``. Fails fast (``ShardFormatError``) when far more shard reads than the spec has
        shards yield no valid sample, instead of spinning forever."""
        from halsift.corpus.shards import ShardFormatError

        n = len(self.shards[spec])
        limit = 2 * n + 1 if len(self.shards) == 1 else 20 * n + 10  # epochs / random resampling
        reads_since_good = 0
        for url in urls:
            reads_since_good += 1
            if reads_since_good > limit:
                raise ShardFormatError(f"data {self.specs[spec]}: no readable sample in {limit} reads of its "
                                       f"{n} shard(s) (every sample was skipped: {skipped.summary()})")
            for sample in read_shard(url, skipped):
                reads_since_good = 0
                yield sample.image, sample.caption.strip()

    def __iter__(self) -> Iterator[dict]:
        import webdataset as wds

        rank, world, worker, nworkers = wds.utils.pytorch_worker_info()
        g, total = rank * nworkers + worker, world * nworkers
        skipped = SkipCounter(max_examples=100)
        rng = random.Random(f"{self.seed}/{g}")
        if len(self.shards) == 1:
            stream = self._samples(self._epoch_urls(g, total), skipped)
        else:
            sources = [self._samples(self._resampled_urls(i, random.Random(f"{self.seed}/{g}/{i}")), skipped, i)
                       for i in range(len(self.shards))]
            stream = (next(sources[rng.choices(range(len(sources)), weights=self.weights)[0]])
                      for _ in iter(int, 1))
        if self.shuffle_buffer > 1:
            stream = _shuffle(stream, self.shuffle_buffer, rng)
        # batches this worker produced before the checkpoint: DataLoader takes batch i from worker i % nworkers
        mine = (self.skip_batches - worker + nworkers - 1) // nworkers if self.skip_batches > worker else 0
        for _ in range(mine * self.batch_size):
            next(stream)
        reported: Counter = Counter()
        while True:
            items = [next(stream) for _ in range(self.batch_size)]
            images = torch.stack([self.preprocess(im) for im, _ in items])
            text = self.tokenizer([c for _, c in items])
            new = skipped.counts - reported
            reported = Counter(skipped.counts)
            yield {"image": images, "text": text, "skipped": sum(new.values()), "skipped_by_kind": dict(new)}


def _shuffle(stream: Iterator, bufsize: int, rng: random.Random) -> Iterator:
    """Reservoir-style shuffle buffer (what ``wds.shuffle`` does, with our own seeded RNG)."""
    buf: list = []
    for item in stream:
        if len(buf) < bufsize:
            buf.append(item)
            continue
        j = rng.randrange(bufsize)
        buf[j], item = item, buf[j]
        yield item
    rng.shuffle(buf)
    yield from buf


def make_loader(specs: Sequence[str], preprocess: Callable, tokenizer: Callable, batch_size: int,
                weights: Sequence[float] | None = None, seed: int = 0, workers: int = 2, shuffle_buffer: int = 256,
                skip_batches: int = 0) -> DataLoader:
    """A DataLoader over :class:`ShardStream` (batches are built inside the workers)."""
    ds = ShardStream(specs, preprocess, tokenizer, batch_size, weights=weights, seed=seed,
                     shuffle_buffer=shuffle_buffer, skip_batches=skip_batches, num_workers=workers)
    return DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=False,
                      prefetch_factor=2 if workers else None, pin_memory=torch.cuda.is_available(),
                      worker_init_fn=ExitWithParent())

