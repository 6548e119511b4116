"""The scoring runner's read-ahead thread keeps order, raises the producer's errors, and stops when abandoned."""

from __future__ import annotations

import threading
import time

import pytest

from halsift.filtering.scoring.prefetch import Prefetcher


def test_order_and_content_kept():
    assert list(Prefetcher(iter(range(100)), depth=3)) == list(range(100))
    assert list(Prefetcher([], depth=1)) == []


def test_producer_error_is_raised_in_the_consumer_after_the_items_before_it():
    def gen():
        yield 1
        yield 2
        raise OSError("tar member truncated")

    got = []
    with pytest.raises(OSError, match="tar member truncated"):
        for x in Prefetcher(gen(), depth=2):
            got.append(x)
    assert got == [1, 2]


def test_an_abandoned_reader_stops_its_thread_and_reads_at_most_depth_ahead():
    produced = []

    def gen():
        for i in range(1000):
            produced.append(i)
            yield i

    reader = Prefetcher(gen(), depth=2)
    it = iter(reader)
    assert next(it) == 0
    time.sleep(0.2)
    assert len(produced) <= 1 + 2 + 1  # the one consumed, a full queue, one waiting to be put
    it.close()  # the consumer stops early (an error in the model, a closed generator)
    assert not reader._thread.is_alive()
    assert not any(t.name == "halsift-prefetch" and t.is_alive() for t in threading.enumerate())


def test_busy_s_is_the_producers_work_not_its_wait_for_room():
    """The producer works ~0.15 s (timed by itself) and waits ~0.45 s for a slow consumer: busy_s is the work."""
    work = []

    def gen():
        for i in range(5):
            t = time.perf_counter()
            time.sleep(0.03)
            work.append(time.perf_counter() - t)
            yield i

    reader = Prefetcher(gen(), depth=1)
    got = []
    for x in reader:
        time.sleep(0.15)  # the consumer is slow: the producer blocks on the full queue
        got.append(x)
    assert got == list(range(5)) and len(work) == 5
    assert sum(work) <= reader.busy_s <= sum(work) + 0.1, (reader.busy_s, sum(work))


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth=0"):
        Prefetcher([1], depth=0)
