"""A deployment's rpm/tpm shared through Redis by every gateway process, for routing
(``gateway.upstream.routing``; the interface is ``gateway.limits.base.DeploymentLimiter``).

One hash per deployment and one-minute window (``r`` requests, ``t`` tokens), which expires with the
window. ``DEPLOY_TAKE`` checks and counts an attempt in one step, so the processes together send a
deployment at most its rpm (and tpm) within a window: the same fixed windows as the in-process
``gateway.limits.local.DeploymentWindow``, on Redis' clock. While Redis is down each process counts its
share (``redis_fallback_processes``) in a window of its own; an attempt counted there is not added to
Redis later (the window is a minute).
"""

from __future__ import annotations

from gateway.limits.local import DeploymentWindow
from gateway.redis.errors import SharedUnavailable
from gateway.redis.lane import Script, args, eval_prefix, ignore
from gateway.redis.state import SharedState

# A deployment's rpm/tpm over one-minute windows (routing). KEYS: 1 its window (a hash: r requests, t tokens;
# it expires with the window); ARGV: 1 rpm (0: none) 2 tpm (0: none) 3 tokens 4 force ('1': count it anyway)
# -> {1} counted | {0, ms until the window ends}
DEPLOY_TAKE = Script(
    "deploy_take",
    """
local v = redis.call('HMGET', KEYS[1], 'r', 't')
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local full = (rpm > 0 and tonumber(v[1] or 0) >= rpm) or (tpm > 0 and tonumber(v[2] or 0) >= tpm)
if full and ARGV[4] ~= '1' then
  return {0, math.max(redis.call('PTTL', KEYS[1]), 1)}
end
redis.call('HINCRBY', KEYS[1], 'r', 1)
redis.call('HINCRBY', KEYS[1], 't', ARGV[3])
if not v[1] then redis.call('PEXPIRE', KEYS[1], 60000) end
return {1}
""",
)

# The real tokens of an attempt replace its estimate, in the window it was counted in (if still there).
# KEYS: 1 window; ARGV: 1 tokens to add (negative: given back)
DEPLOY_SETTLE = Script(
    "deploy_settle",
    """
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HINCRBY', KEYS[1], 't', ARGV[1]) < 0 then redis.call('HSET', KEYS[1], 't', 0) end
end
return 0
""",
)


# --- a deployment ----------------------------------------------------------------------------------------
class SharedDeploymentWindow:
    """A deployment's rpm/tpm in Redis for every process (``gateway.limits.base.DeploymentLimiter``): an
    attempt is checked and counted in one script (``DEPLOY_TAKE``). While Redis is down: this process's share
    (``redis_fallback_processes``) in a window of its own. ``until``: the end of the window Redis last said is
    full (on the router's clock)."""

    __slots__ = ("state", "rpm", "tpm", "local", "until", "_take_prefix", "_settle_prefix")
    shared = True

    def __init__(self, state: SharedState, model: str, name: str, rpm: int | None, tpm: int | None) -> None:
        self.state = state
        self.rpm, self.tpm = rpm, tpm
        n = self.state.fallback_processes
        self.local = DeploymentWindow(
            None if rpm is None else max(1, rpm // n), None if tpm is None else max(1, tpm // n)
        )
        self.until = 0.0
        key = f"{self.state.prefix}:d:{model}:{name}:window"
        self._take_prefix = eval_prefix(DEPLOY_TAKE, [key], 4)
        self._settle_prefix = eval_prefix(DEPLOY_SETTLE, [key], 1)

    def limited(self, now: float) -> bool:
        if self.state.up:
            return now < self.until
        return self.local.limited(now)

    def free_at(self, now: float) -> float:
        if self.state.up:
            return max(now, self.until)
        return self.local.free_at(now)

    async def take(self, now: float, tokens: int, force: bool = False) -> bool:
        st = self.state
        if st.up:
            payload = self._take_prefix + args(self.rpm or 0, self.tpm or 0, tokens, b"1" if force else b"0")
            try:
                res = await st.run(DEPLOY_TAKE, payload)
            except SharedUnavailable:
                pass  # counted in this process's share below
            else:
                if res[0] == 1:
                    return True
                self.until = now + res[1] / 1000
                return False
        if not force and self.local.limited(now):
            return False
        self.local.begin(tokens)
        return True

    def begin(self, tokens: int) -> None:
        pass  # ``take`` counted it

    def settle(self, estimate: int, actual: int) -> None:
        if self.tpm is None or actual == estimate:
            return
        if not self.state.up:
            self.local.settle(estimate, actual)
            return
        try:
            ignore(self.state.send(self._settle_prefix + args(actual - estimate)))
        except SharedUnavailable:
            self.local.settle(estimate, actual)
