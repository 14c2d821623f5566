"""One process's budget for reply bytes being read at once: every agent and env reply in flight
counts against it while it is read, so many large replies at the same time cannot take a worker
past its memory (the per-reply cap, ``GYMWEB_MAX_REPLY_BYTES``, bounds one reply only)."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

from rollouts.engine.targets import ReplyTooLarge

BUDGET_SETTING = "GYMWEB_REPLY_BUDGET_BYTES"
# After a spike of at least this many bytes, freed memory is handed back to the system once no reply
# is being read (glibc keeps freed heap otherwise, and the worker's RSS stays at its peak).
TRIM_AFTER_BYTES = 32 * 1024 * 1024


class ReplyOverBudget(ReplyTooLarge):
    """A reply could not be read because the replies being read at once in this process already
    hold the budget (bytes). What was read of it is dropped."""

    def __init__(self, url: str, limit: int):
        super().__init__(url, limit)
        self.args = (
            f"the replies being read at once in this worker passed {limit:,} bytes ({BUDGET_SETTING}); "
            f"gymweb stopped reading the reply from {url}",
        )


def _malloc_trim() -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        pass


class ReplyBudget:
    """Bytes taken by replies being read (``take``/``give``; thread-safe). ``limit`` in bytes;
    None means unbounded. ``peak`` is the most taken at once since the last trim."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Count ``n`` more bytes; False (nothing counted) when that would pass the limit."""
        with self._lock:
            if self.limit is not None and self.used + n > self.limit:
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def give(self, n: int) -> None:
        """Return ``n`` bytes taken earlier; after a large spike, hand freed memory back once idle."""
        with self._lock:
            self.used = max(0, self.used - n)
            trim = self.used == 0 and self.peak >= TRIM_AFTER_BYTES
            if trim:
                self.peak = 0
        if trim:
            _malloc_trim()
