"""The memory_per_sample invariant's measure and its judge: memory in use, not resident memory, per sample.

A healthy LunarLander run gains about 150 bytes of RSS per sample, all of it in glibc's free lists; a leak
grows the memory in use. The judge (`MemoryGrowth`) counts samples, never seconds, and the Ray driver judges
each actor incarnation on the samples it produced."""

from __future__ import annotations

import math

import numpy as np
import psutil
import pytest

from rlvitals.distributed.accounting import ActorAccounts
from rlvitals.evidence import MEMORY_MIN_GROWTH, MEMORY_MIN_POINTS, MemoryGrowth
from rlvitals.telemetry.memory import _MALLINFO2, malloc_free_bytes, memory_in_use

MiB = 2 ** 20


@pytest.mark.skipif(_MALLINFO2 is None, reason="needs glibc's mallinfo2")
def test_freed_heap_memory_stays_resident_but_is_not_in_use():
    process = psutil.Process()
    # 16 KiB buffers sit on malloc's heap (under its mmap threshold); freeing every other one fragments it, so
    # glibc can give none of it back: resident memory stays, the memory in use drops by what was freed.
    buffers = [np.ones(2048) for _ in range(12_000)]              # about 190 MiB
    rss_full, in_use_full = process.memory_info().rss, memory_in_use()
    del buffers[::2]
    rss_half, in_use_half, free = process.memory_info().rss, memory_in_use(), malloc_free_bytes()
    freed = 6_000 * 2048 * 8
    assert rss_half > rss_full - freed / 4, "glibc returned the fragmented pages: the premise no longer holds"
    assert free > freed * 0.8
    assert in_use_full - in_use_half > freed * 0.8
    kept = [np.ones(2048) for _ in range(6_000)]                  # what a leak keeps is in use
    assert memory_in_use() - in_use_half > freed * 0.8
    del kept, buffers


def feed(growth: MemoryGrowth, bytes_per_sample: float, points: int, samples_per_point: int = 4096,
         start: float = 500 * MiB, step_at: int | None = None, sample_bytes: float = 500.0) -> float:
    value = math.nan
    for i in range(1, points + 1):
        memory = start + bytes_per_sample * samples_per_point * i + (64 * MiB if step_at and i >= step_at else 0)
        value = growth.add(samples_per_point * i, memory, sample_bytes)
    return value


def test_a_leak_is_measured_in_samples_worth_and_flat_memory_reads_zero():
    assert math.isnan(feed(MemoryGrowth(), 1000.0, MEMORY_MIN_POINTS - 1)), "judged before it has its points"
    # 1000 bytes gained per sample of 500 bytes: two samples' worth kept per sample; the same bytes per sample
    # of Atari frames (28 kB) are a small share of one
    assert feed(MemoryGrowth(), 1000.0, 400) == pytest.approx(2.0)
    assert feed(MemoryGrowth(), 1000.0, 400, sample_bytes=28_224) == pytest.approx(1000 / 28_224)
    assert math.isnan(feed(MemoryGrowth(), 1000.0, 400, sample_bytes=0.0)), "no unit, no judgement"
    assert feed(MemoryGrowth(), 0.0, 400) == 0.0
    # a one-off allocation (a cache filling once) grows one quarter only
    assert feed(MemoryGrowth(), 0.0, 400, step_at=300) == 0.0
    # growth under the floor is allocator noise, whatever its rate per sample
    small = MEMORY_MIN_GROWTH / (200 * 64) / 2
    assert feed(MemoryGrowth(), small, 400, samples_per_point=64) == 0.0


def counters(actor: int, produced: int, samples: int, memory: float) -> dict:
    return {"actor": actor, "pid": 100 + actor, "produced": produced, "delivered": produced, "dropped": {},
            "seconds": {}, "wall": 0.0, "samples": samples, "memory": memory, "sample_bytes": 1024.0}


class Arrival:
    def __init__(self, *snapshots):
        self.actor_counters = snapshots


def test_the_driver_judges_each_actor_incarnation_on_the_samples_it_produced():
    accounts = ActorAccounts()
    for n in range(1, 200):
        accounts.arrived(Arrival(counters(0, n, 512 * n, 300 * MiB)))                # flat
        accounts.arrived(Arrival(counters(1, n, 512 * n, 300 * MiB + 2048 * 512 * n)))  # 2 KiB per sample
    statistic = accounts.take_statistic()
    assert statistic["inv_actor_accounting"] == 0
    assert statistic["actors_memory_per_sample"] == pytest.approx(2.0)   # two 1 KiB samples' worth per sample
    assert statistic["actors_memory_named"].startswith("actor 1 (pid 101): 2 samples' worth")   # whose: named
    assert "other" not in statistic["actors_memory_named"]      # actor 0 is flat: the one actor that grows
    for n in range(200, 800):      # actor 0 starts growing too: the text says the worst is not alone
        accounts.arrived(Arrival(counters(0, n, 512 * n, 300 * MiB + 1024 * 512 * (n - 199))))
        accounts.arrived(Arrival(counters(1, n, 512 * n, 300 * MiB + 2048 * 512 * n)))
    assert accounts.take_statistic()["actors_memory_named"].endswith("; 1 of the other 1 measured actors also over 0.5")
    # taken once per update (actors_slow, the peers' comparison, is on every update)
    assert accounts.take_statistic().keys() == {"actors_slow", "actors_silent"}, "taken once per update"
