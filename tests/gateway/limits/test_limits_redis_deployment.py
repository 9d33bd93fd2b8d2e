"""A deployment's rpm/tpm shared through Redis (gateway.limits.redis_deployment, a real redis-server): two
processes count one deployment together, one atomic step per attempt; a forced attempt counts; the real
tokens replace the estimate; while Redis is down each process counts its own share."""

from __future__ import annotations

import asyncio
import socket

from shared_redis import shared_states  # noqa: F401  (the fixture)

from gateway.limits.redis_deployment import SharedDeploymentWindow


async def test_two_processes_send_a_deployment_its_rpm_together(shared_states):  # noqa: F811
    (_, one), (_, two) = await shared_states(), await shared_states()
    windows = [one.deployment("m", "a", 3, None), two.deployment("m", "a", 3, None)]
    assert all(isinstance(w, SharedDeploymentWindow) and w.shared for w in windows)
    taken = [await windows[i % 2].take(0.0, 10) for i in range(8)]
    assert taken == [True, True, True] + [False] * 5
    assert all(w.limited(0.0) for w in windows)  # each was told by Redis: skipped until the window ends
    assert 50.0 < windows[0].free_at(0.0) <= 60.0
    assert await windows[1].take(0.0, 10, force=True)  # sent anyway (every deployment is limited): counted
    # at once from both, one atomic step each: still exactly the rpm
    windows = [one.deployment("m", "b", 3, None), two.deployment("m", "b", 3, None)]
    taken = await asyncio.gather(*(windows[i % 2].take(0.0, 10) for i in range(10)))
    assert taken.count(True) == 3


async def test_the_real_tokens_replace_the_estimate(shared_states):  # noqa: F811
    (_, one), (_, two) = await shared_states(), await shared_states()
    w1, w2 = one.deployment("m", "t", None, 100), two.deployment("m", "t", None, 100)
    assert await w1.take(0.0, 100)  # the estimate fills the window
    assert not await w2.take(0.0, 1)
    w1.settle(100, 10)  # the request used 10: sent without waiting, ahead of w1's next command
    assert await w1.take(0.0, 1)
    assert await w2.take(0.0, 1)


async def test_while_redis_is_down_each_process_counts_its_share(shared_states):  # noqa: F811
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state, limits = await shared_states(url=f"redis://127.0.0.1:{port}/0", redis_fallback_processes=2)
    assert not state.up
    window = limits.deployment("m", "a", 4, None)  # 2 a minute for each of 2 processes
    assert [await window.take(0.0, 1) for _ in range(3)] == [True, True, False]
    assert window.limited(1.0) and window.free_at(1.0) == 60.0
    assert await window.take(1.0, 1, force=True)
