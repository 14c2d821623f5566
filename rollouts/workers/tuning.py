"""Process tuning for a dispatcher: Python's cyclic garbage collector (``collector_tuned``) and the
open-file limit (``raise_fd_limit``)."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("gymweb.dispatch")

__all__ = ["collector_tuned", "raise_fd_limit"]


_gc_lock = threading.Lock()
_gc_users = 0
_gc_saved: tuple[int, int, int] = (700, 10, 10)


@contextmanager
def collector_tuned(threshold0: int) -> Iterator[None]:
    """Python's cyclic garbage collector set for a dispatcher, for the duration of the block.

    With thousands of rollouts in flight the heap holds millions of live objects (every
    conversation, parsed), and the collector's default first threshold (700 allocations) makes it
    walk them again and again, a large part of the process's CPU (benchmarks/README.md). Inside the
    block the objects that exist at its start (Django, the libraries) are frozen out of every
    collection (``gc.freeze``) and the first threshold is
    ``threshold0`` allocations (``GYMWEB_GC_THRESHOLD``; 0 leaves the collector as it is).
    Reference counting still frees everything that is not in a cycle at once; cycles are still
    collected, less often. The settings are the process's: nested or concurrent blocks share them
    and the last one out restores the previous thresholds and unfreezes."""
    global _gc_users, _gc_saved
    if threshold0 <= 0:
        yield
        return
    with _gc_lock:
        if _gc_users == 0:
            _gc_saved = gc.get_threshold()
            gc.freeze()  # no collect first: garbage frozen now is collectable again after unfreeze
            gc.set_threshold(threshold0, _gc_saved[1], _gc_saved[2])
        _gc_users += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0:
                gc.set_threshold(*_gc_saved)
                gc.unfreeze()


def raise_fd_limit(needed: int) -> int:
    """Raise the process's soft open-file limit (RLIMIT_NOFILE) towards its hard limit when it is
    below ``needed`` (each rollout in flight may hold an agent and an env connection). Returns the
    soft limit now in force; logs a warning when even the hard limit is below ``needed`` (then
    connections past it fail as "could not reach", which are retried as failures)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return needed
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        target = hard if hard == resource.RLIM_INFINITY else min(hard, max(needed, soft))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the open-file limit is %d, below the %d this dispatcher may need for its capacity; "
            "raise `ulimit -n` or lower GYMWEB_PROCESS_CAPACITY",
            soft,
            needed,
        )
    return soft
