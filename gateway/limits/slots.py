"""A provider's fair slots (``FairSlots``, a ``gateway.limits.base.ProviderSlots``): ``max_connections``
slots shared by projects, one held by each request in flight to the provider. Each provider's client
(gateway.upstream.client) is given its own by the limits (``Limiters.provider``); they count this process's
connections, so they are in this process with shared limits too.

While slots are free, anyone gets one at once. When they are scarce, a freed slot goes to the project with
waiters that holds the fewest slots (ties: the one served least recently), so a project with one request
waiting is served next, not behind another project's forty. ``acquire`` returns the seconds waited.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque


class _Share:
    __slots__ = ("held", "waiters", "last")

    def __init__(self) -> None:
        self.held = 0  # slots this project holds now
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.last = 0  # sequence number of its latest grant


class FairSlots:
    """``capacity`` slots shared by projects: free slots are taken at once; when a project has to wait, a
    freed slot goes to the waiting project holding the fewest (ties: the least recently served)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = capacity
        self._shares: dict[str, _Share] = {}
        self._queued: dict[str, _Share] = {}  # projects with waiters
        self._seq = 0

    @property
    def waiting(self) -> int:
        return sum(len(s.waiters) for s in self._queued.values())

    def held(self, project: str) -> int:
        s = self._shares.get(project)
        return s.held if s is not None else 0

    async def acquire(self, project: str) -> float:
        """Take a slot for ``project``; returns the seconds waited for it."""
        share = self._shares.get(project)
        if share is None:
            share = self._shares[project] = _Share()
        if self.free > 0 and not self._queued:
            self.free -= 1
            share.held += 1
            self._seq += 1
            share.last = self._seq
            return 0.0
        t0 = time.perf_counter()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        share.waiters.append(fut)
        self._queued[project] = share
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted, then cancelled before it ran: pass it on
                self.release(project)
            else:
                self._forget(project, share, fut)
            raise
        return time.perf_counter() - t0

    def _forget(self, project: str, share: _Share, fut: asyncio.Future[None]) -> None:
        try:
            share.waiters.remove(fut)
        except ValueError:
            pass
        if not share.waiters:
            self._queued.pop(project, None)

    def release(self, project: str) -> None:
        self._shares[project].held -= 1
        while self._queued:
            name, share = min(self._queued.items(), key=lambda kv: (kv[1].held, kv[1].last))
            fut = share.waiters.popleft()
            if not share.waiters:
                del self._queued[name]
            if fut.done():  # cancelled while waiting; its task will find it gone
                continue
            share.held += 1
            self._seq += 1
            share.last = self._seq
            fut.set_result(None)
            return
        self.free += 1
