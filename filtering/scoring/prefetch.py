"""Read ahead of the model: run an iterator (tar reading, image decoding, batching) in a background thread.

The scoring runner's input is a generator whose work is mostly I/O and C code that releases the GIL (tar
members, JPEG/PNG decoding in Pillow), so one thread overlaps it with the model's forward pass without the
pickling and start-up costs of worker processes. Order is kept, the queue is bounded (``depth`` items: memory
stays one part's worth), an exception in the thread is raised in the consumer, and a consumer that stops early
(an error, a closed generator) stops the thread. Hand-written over ``concurrent.futures`` because that maps a
function over known inputs, while this pulls from one stateful generator.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
_END = object()


class Prefetcher:
    """Iterate ``iterable`` ``depth`` items ahead in a daemon thread; ``busy_s`` is the thread's working time
    (producing items, not waiting for room in the queue)."""

    def __init__(self, iterable: Iterable[T], depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"depth={depth!r}: expected an integer >= 1")
        self.busy_s = 0.0
        self._it = iter(iterable)
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="halsift-prefetch", daemon=True)
        self._thread.start()

    def _put(self, entry: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            while True:
                t = time.perf_counter()
                try:
                    x = next(self._it)
                except StopIteration:
                    break
                finally:
                    self.busy_s += time.perf_counter() - t
                if not self._put((None, x)):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            self._put((e, None))
            return
        self._put((None, _END))

    def __iter__(self) -> Iterator[T]:
        try:
            while True:
                err, x = self._q.get()
                if err is not None:
                    raise err
                if x is _END:
                    return
                yield x
        finally:
            self.close()

    def close(self) -> None:
        """Stop the thread (it finishes the item it is producing) and wait for it."""
        self._stop.set()
        self._thread.join()


__all__ = ["Prefetcher"]
