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

Decoded-sample cache (``cache_bytes``, only for a deterministic ``preprocess``: the trainer passes it without
``augment``): a shard read whole is kept in memory with each sample's preprocessed image tensor (made when the sample
first enters a batch), so later epochs skip reading, decoding and preprocessing it; a re-read shard adds its skip
counts again, as reading it would. Shards are admitted while the estimate fits the budget (per reader process); the
stream and the batches are exactly those without the cache. Filtered selections are small and trained for many
epochs (the quickstart's: 1,800 captions, ~11 epochs), where decoding was a third of a fine-tuning step on CPU.
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
                 skip_batches: int = 0, num_workers: int = 1, cache_bytes: int = 0) -> None:
        self.shards = [[str(p) for p in expand_shards(s)] for s in specs]
        self.specs = list(specs)
        self.weights = list(weights) if weights else [1.0] * len(specs)
        self.preprocess, self.tokenizer = preprocess, tokenizer
        self.batch_size, self.seed, self.shuffle_buffer = batch_size, seed, shuffle_buffer
        self.skip_batches = skip_batches  # batches already consumed by this rank (all its workers together)
        self.num_workers = max(1, num_workers)
        self.cache_bytes = int(cache_bytes)

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
    def _samples(self, urls: Iterator[str], skipped: SkipCounter, cache: "_ShardCache", spec: int = 0
                 ) -> Iterator["_Item"]:
        """The valid samples (:func:`~halsift.corpus.sample.read_shard`) as :class:`_Item`; the rest are counted in
        ``skipped``. Fails fast (``ShardFormatError``) when far more shard reads than the spec has shards yield no
        valid sample, instead of spinning forever."""
        from halsift.corpus.shards import ShardFormatError

        n = len(self.shards[spec])
        limit = 2 * n + 1 if len(self.shards) == 1 else 20 * n + 10  # epochs / random resampling
        reads_since_good = 0
        for url in urls:
            reads_since_good += 1
            if reads_since_good > limit:
                raise ShardFormatError(f"data {self.specs[spec]}: no readable sample in {limit} reads of its "
                                       f"{n} shard(s) (every sample was skipped: {skipped.summary()})")
            kept = cache.get(url)
            if kept is not None:  # a re-read counts its skipped samples again, each where reading would
                items, tail = kept
                for item in items:
                    if item.skips:
                        skipped.counts.update(item.skips)
                    reads_since_good = 0
                    yield item
                skipped.counts.update(tail)
                continue
            if not cache.enabled:
                for sample in read_shard(url, skipped):
                    reads_since_good = 0
                    yield _Item(sample.image, sample.caption.strip())
                continue
            # kept while the shard fits what is left of the budget; its own skips (a mixture's other specs add to
            # `skipped` meanwhile) recorded where they happen
            items, shard, mark = [], _ShardSkips(skipped), Counter()
            for sample in read_shard(url, shard):
                reads_since_good = 0
                item = _Item(sample.image, sample.caption.strip())
                if items is not None:
                    if shard.counts != mark:
                        item.skips, mark = shard.counts - mark, Counter(shard.counts)
                    items.append(item)
                    if not cache.fits(len(items), item, self.preprocess):
                        items = None  # too big to keep: read again next epoch
                yield item
            if items is not None:
                cache.keep(url, items, shard.counts - mark)

    def __iter__(self) -> Iterator[dict]:
        import webdataset as wds

        rank, world, worker, nworkers = wds.utils.pytorch_worker_info()
        g, total = rank * nworkers + worker, world * nworkers
        skipped = SkipCounter(max_examples=100)
        cache = _ShardCache(self.cache_bytes)
        rng = random.Random(f"{self.seed}/{g}")
        if len(self.shards) == 1:
            stream = self._samples(self._epoch_urls(g, total), skipped, cache)
        else:
            sources = [self._samples(self._resampled_urls(i, random.Random(f"{self.seed}/{g}/{i}")), skipped, cache,
                                     i) for i in range(len(self.shards))]
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
            images = torch.stack([it.pixels(self.preprocess, cache.enabled) for it in items])
            text = self.tokenizer([it.caption for it in items])
            new = skipped.counts - reported
            reported = Counter(skipped.counts)
            yield {"image": images, "text": text, "skipped": sum(new.values()), "skipped_by_kind": dict(new)}


class _Item:
    """One valid sample in the stream: its decoded image until the first batch preprocesses it, then (when the
    stream caches) only the preprocessed tensor; ``skips``: what the reader skipped just before it."""

    __slots__ = ("image", "caption", "tensor", "skips")

    def __init__(self, image, caption: str) -> None:
        self.image, self.caption, self.tensor, self.skips = image, caption, None, None

    def pixels(self, preprocess: Callable, keep: bool) -> torch.Tensor:
        if self.tensor is not None:
            return self.tensor
        tensor = preprocess(self.image)
        if keep:
            self.tensor, self.image = tensor, None
        return tensor


class _ShardSkips(SkipCounter):
    """One shard's skip counts, each also added to the stream's counter as it happens."""

    def __init__(self, stream: SkipCounter) -> None:
        super().__init__(max_examples=0)
        self.stream = stream

    def add(self, key: str, reason: str, kind: str | None = None, n: int = 1) -> None:
        super().add(key, reason, kind, n)
        self.stream.add(key, reason, kind, n)


class _ShardCache:
    """Whole shards' items and the skips after their last item, kept while they fit ``budget`` bytes (0: off); one
    transformed image tells the size of every kept sample."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used, self.item_bytes = budget, 0, 0
        self.shards: dict[str, tuple[list[_Item], Counter]] = {}

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def get(self, url: str) -> tuple[list[_Item], Counter] | None:
        return self.shards.get(url)

    def fits(self, n: int, item: _Item, preprocess: Callable) -> bool:
        """Whether ``n`` samples of a shard being read still fit what is left."""
        if not self.item_bytes:
            t = item.pixels(preprocess, keep=True)
            self.item_bytes = t.numel() * t.element_size()
        return self.used + n * self.item_bytes <= self.budget

    def keep(self, url: str, items: list[_Item], tail: Counter) -> None:
        self.shards[url], self.used = (items, Counter(tail)), self.used + len(items) * self.item_bytes


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
                skip_batches: int = 0, cache_bytes: int = 0) -> DataLoader:
    """A DataLoader over :class:`ShardStream` (batches are built inside the workers; ``cache_bytes`` per worker,
    for a deterministic ``preprocess`` only)."""
    ds = ShardStream(specs, preprocess, tokenizer, batch_size, weights=weights, seed=seed,
                     shuffle_buffer=shuffle_buffer, skip_batches=skip_batches, num_workers=workers,
                     cache_bytes=cache_bytes)
    return DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=False,
                      prefetch_factor=2 if workers else None, pin_memory=torch.cuda.is_available(),
                      worker_init_fn=ExitWithParent())

