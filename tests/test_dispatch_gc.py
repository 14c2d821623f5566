"""The dispatcher's garbage-collector settings (with thousands in flight Python's default
thresholds spend much of the process's CPU walking the heap) hold while it runs and are put back
when it stops, nested or not."""

from __future__ import annotations

import gc

from rollouts.workers.tuning import collector_tuned


def test_it_sets_the_threshold_and_freezes_the_heap_only_inside_the_block():
    before = gc.get_threshold()
    with collector_tuned(50_000):
        assert gc.get_threshold() == (50_000, before[1], before[2])
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_nested_blocks_restore_once_the_last_ends():
    before = gc.get_threshold()
    with collector_tuned(50_000):
        with collector_tuned(50_000):
            pass
        assert gc.get_threshold()[0] == 50_000  # the outer dispatcher still runs
    assert gc.get_threshold() == before


def test_zero_leaves_the_collector_alone():
    before = gc.get_threshold()
    with collector_tuned(0):
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() == 0


def test_cycles_made_inside_are_still_collected():
    with collector_tuned(50_000):

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2
