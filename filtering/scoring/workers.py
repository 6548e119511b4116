"""Scoring with the input pipeline in worker processes: tar reading, image decoding and the detector's CPU half
(:meth:`~halsift.filtering.detectors.base.Detector.prepare`: preprocessing, tokenization) run in ``torch.utils.data``
DataLoader workers, one part (shard) per worker at a time, while the main process only runs the model.

The read-ahead thread of :func:`halsift.filtering.scoring.parts.score_part` overlaps that work with the model but shares
the GIL with it; worker processes do not. Each worker streams its parts' batches as
``{"part", "rows", "prepared"}`` messages and ends each part with ``{"part", "end": True, "samples", "skipped"}``;
the main process scores the batches as they come (parts interleave across workers) and writes a part, atomically,
when its end arrives, so parts are written whole or not at all and a rerun resumes exactly as before. The parts'
rows, scores and skip counts are the ones :func:`~halsift.filtering.scoring.parts.score_part` writes. Workers are forked
(the default on Linux): the detector is inherited, not pickled, and workers never touch its model. A worker ends
when the main process dies, even by SIGKILL (:mod:`halsift.corpus.parent_watch`).

Tensors travel as numpy arrays pickled through the worker's pipe (:class:`_Array`), not as shared-memory
tensors: torch hands a shared tensor over by connecting to the worker's file-descriptor server, a thread that
waits for the busy worker's GIL, so the model's process stalled ~3 ms per tensor on a loaded CPU. On a GPU
host the DataLoader's pin-memory thread turns them back into page-locked tensors.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from halsift.corpus.images import SkipCounter
from halsift.corpus.parent_watch import ExitWithParent
from halsift.filtering.detectors.base import Detector
from halsift.filtering.scoring.parts import Counted, Part, PartRows, batches, item_rows, iter_caption_groups
from halsift.filtering.scoring.guard import ScoreGuard


_NUMPY_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
                 torch.uint8, torch.bool}  # what torch.Tensor.numpy() can share (not bfloat16)


class _Array:
    """A CPU tensor in transit from a worker: its numpy array, pickled by value."""

    __slots__ = ("array",)

    def __init__(self, array) -> None:
        self.array = array

    def tensor(self):
        return torch.from_numpy(self.array)

    def pin_memory(self, device=None):  # called by the DataLoader's pin-memory thread
        return self.tensor().pin_memory()


def _map(x, leaf):
    """``x`` with ``leaf`` applied to every value inside dicts, lists and tuples (mapping types kept)."""
    if isinstance(x, MutableMapping):
        out = copy.copy(x)
        out.update({k: _map(v, leaf) for k, v in x.items()})
        return out
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(_map(v, leaf) for v in x)
    return leaf(x)


def _pack(x):
    def leaf(v):
        if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dtype in _NUMPY_DTYPES:
            return _Array(v.detach().numpy())
        return v

    return _map(x, leaf)


def _unpack(x):
    return _map(x, lambda v: v.tensor() if isinstance(v, _Array) else v)


def _as_is(x):
    return x


def supports_workers(detector: Detector) -> bool:
    """Whether ``detector`` has a CPU half to move into workers (else scoring stays in-process)."""
    return type(detector).prepare is not Detector.prepare


class _PartStream(IterableDataset):
    def __init__(self, detector: Detector, parts: Sequence[Part], unit: str, batch_size: int) -> None:
        self.detector, self.parts, self.unit, self.batch_size = detector, list(parts), unit, batch_size

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        mine = self.parts[info.id::info.num_workers] if info is not None else self.parts
        for part in mine:
            t0 = time.perf_counter()
            skipped = SkipCounter(max_examples=1000)
            groups = Counted(iter_caption_groups(part, self.unit, skipped, draft=self.detector.decode_size,
                                                 arrays=self.detector.image_arrays))
            for batch in batches(groups, self.batch_size):
                yield {"part": part.name, "rows": item_rows(batch), "prepared": _pack(self.detector.prepare(batch))}
            yield {"part": part.name, "end": True, "samples": groups.count, "skipped": skipped.to_json(),
                   "decode_s": time.perf_counter() - t0}


def score_parts_in_workers(detector: Detector, parts: Sequence[Part], out: Path, unit: str, batch_size: int,
                           workers: int, bar=None, rank: int = 0, world: int = 1,
                           fingerprints: dict | None = None, guard: ScoreGuard | None = None,
                           on_part: Callable[[str, dict], None] | None = None) -> int:
    """Score ``parts`` into ``out`` with ``workers`` input processes; returns the number of sentences scored.
    ``guard``: checks every batch's results (:class:`~halsift.filtering.scoring.guard.ScoreGuard`); ``on_part(name,
    stats)``: called as each part is written (the task engine releases its claim there)."""
    guard = guard if guard is not None else ScoreGuard(detector.name)
    pin = torch.cuda.is_available()
    loader = DataLoader(_PartStream(detector, parts, unit, batch_size), batch_size=None, num_workers=workers,
                        collate_fn=_as_is, prefetch_factor=4, pin_memory=pin, persistent_workers=False,
                        worker_init_fn=ExitWithParent())  # a killed main process takes its workers with it
    open_parts: dict[str, tuple[PartRows, float]] = {}
    by_name = {p.name: p for p in parts}
    scored = 0
    for msg in loader:
        name = msg["part"]
        rows, started = open_parts.setdefault(name, (PartRows(detector, guard), time.perf_counter()))
        if msg.get("end"):
            stats = rows.write(out / name, by_name[name], rank, world, msg["samples"], msg["skipped"],
                               time.perf_counter() - started, msg["decode_s"], (fingerprints or {}).get(name))
            scored += stats["sentences"]
            del open_parts[name]
            if on_part is not None:
                on_part(name, stats)
            continue
        tm = time.perf_counter()
        results = detector.score_prepared(msg["rows"], msg["prepared"] if pin else _unpack(msg["prepared"]))
        rows.t_model += time.perf_counter() - tm
        rows.add(msg["rows"], results)
        if bar is not None:
            bar.update(len(msg["rows"]))
    return scored


__all__ = ["score_parts_in_workers", "supports_workers"]
