"""How many calls one worker process has in flight to one resources server (env) at a time, and
which rollout's call goes next when that many are out: the one that started first.

Most NeMo Gym resources servers are one uvicorn process. Sent every rollout's next call at once,
such a server answers them in arrival order, so a batch's rollouts all advance a step together
and all end together, at the end of the batch; its connections and CPU per request grow with the
calls it holds. With a bound, the calls beyond it wait in the worker, and the oldest rollout's
call is sent first: the env stays as busy, and rollouts end in the order they started, which a
trainer reading results as they finish (``GET /api/v1/runs/{id}/results``) sees as early results.
The bound is ``GYMWEB_ENV_MAX_IN_FLIGHT`` (0: none, NeMo Gym's behaviour); a run may set its own
(the run setting ``env_max_in_flight``), which replaces it for that run's calls.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class _Lane:
    """One env's calls: how many are out, and the waiting ones as a heap of
    (priority, arrival number, future)."""

    __slots__ = ("out", "waiting")

    def __init__(self) -> None:
        self.out = 0
        self.waiting: list[tuple[float, int, asyncio.Future[None]]] = []


class EnvGate:
    """At most ``max_in_flight`` calls out to each env URL from this process (<= 0: no bound, and
    ``turn`` costs nothing); waiting calls go out lowest ``priority`` first (a rollout's start
    time), ties in arrival order. A call may bring its own bound (``turn``'s ``limit``): calls to
    one env with the same bound share its places. For use on one event loop only."""

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = int(max_in_flight)
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._arrivals = itertools.count()

    @asynccontextmanager
    async def turn(self, env_url: str, priority: float, limit: int = 0) -> AsyncIterator[None]:
        """Hold one of ``env_url``'s places for the body of the ``async with``; waits (cancellably,
        e.g. by the rollout's timeout) while all are out. The place is handed on when the body
        ends, however it ends. ``limit`` > 0: this call's bound (a run's ``env_max_in_flight``)
        instead of ``max_in_flight``."""
        bound = int(limit) if limit and limit > 0 else self.max_in_flight
        if bound <= 0:
            yield
            return
        key = (env_url, bound)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        if lane.out < bound and not lane.waiting:
            lane.out += 1
        else:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(lane.waiting, (priority, next(self._arrivals), future))
            try:
                await future
            except asyncio.CancelledError:
                # Handed a place just as it was cancelled: pass the place on, or it is lost.
                if future.done() and not future.cancelled():
                    self._hand_on(key, lane)
                raise
        try:
            yield
        finally:
            self._hand_on(key, lane)

    def _hand_on(self, key: tuple[str, int], lane: _Lane) -> None:
        """A place came back: give it to the first waiting call still waiting, else count it free."""
        while lane.waiting:
            _, _, future = heapq.heappop(lane.waiting)
            if not future.done():
                future.set_result(None)  # the place moves to it: ``out`` is unchanged
                return
        lane.out -= 1
        if lane.out == 0:
            del self._lanes[key]

    def in_flight(self, env_url: str) -> int:
        """Calls out to ``env_url`` now, whatever their bound (0 for an env with none, or with no bound)."""
        return sum(lane.out for (url, _), lane in self._lanes.items() if url == env_url)

    def waiting(self, env_url: str) -> int:
        """Calls waiting for a place at ``env_url`` (cancelled ones not yet popped included)."""
        return sum(len(lane.waiting) for (url, _), lane in self._lanes.items() if url == env_url)
