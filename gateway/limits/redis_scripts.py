"""The Lua scripts of one project's limits through Redis, which ``gateway.limits.redis_project`` runs:
admission (``ADMIT``), a queued request's retry for a slot (``SLOT``), release and settlement (``SETTLE``) and
the refund of a request that was not admitted after all (``REFUND``); with Redis' clock in a script
(``NOW``, which ``gateway.limits.redis``'s ``RENEW`` uses too) and the units of the counters they keep: the
UTC day their keys are for, and nano-dollars for cost.
"""

from __future__ import annotations

import time

from gateway.redis.lane import Script

DAY_TTL_S = 2 * 86400  # a day's counters outlive it by a day
NANO_USD = 1_000_000_000  # cost counters in Redis are integers: nano-dollars


def nanos(usd: float) -> int:
    return max(0, round(usd * NANO_USD))


def utc_day() -> int:
    return int(time.time() // 86400)


# --- Lua ---------------------------------------------------------------------------------------------
NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# held: the leases holding a budget reservation (token and/or cost); amounts/total: the token
# reservations per lease and their sum; camounts/ctotal: the same for the cost budget (nano-dollars)
_EXPIRE_RESERVATIONS = """
local function drop_expired(dead, amounts, total)
  local r = tonumber(redis.call('GET', total) or 0)
  if #dead > 0 then
    local sum = 0
    local vals = redis.call('HMGET', amounts, unpack(dead))
    for i = 1, #vals do if vals[i] then sum = sum + tonumber(vals[i]) end end
    if sum > 0 then
      redis.call('HDEL', amounts, unpack(dead))
      r = math.max(0, r - sum)
      redis.call('SET', total, r)
    end
  end
  return r
end
local function expire_reservations(held, amounts, total, camounts, ctotal, now)
  local dead = redis.call('ZRANGEBYSCORE', held, '-inf', now, 'LIMIT', 0, 500)
  local r = drop_expired(dead, amounts, total)
  local cr = drop_expired(dead, camounts, ctotal)
  if #dead > 0 then redis.call('ZREM', held, unpack(dead)) end
  return r, cr
end
-- a lease's reservation in amounts (and its part of total) goes back
local function unreserve(lid, amounts, total)
  local amt = redis.call('HGET', amounts, lid)
  if amt then
    redis.call('HDEL', amounts, lid)
    if redis.call('DECRBY', total, amt) < 0 then redis.call('SET', total, 0) end
  end
end
"""

# KEYS: 1 slots 2 queue 3 held 4 resamt 5 reserved 6 rpm 7 tpm 8 used(day) 9 seeded(day)
#       10 cost(day) 11 cresamt 12 creserved
# ARGV: 1 lid 2 lease_ms 3 max_concurrency 4 rpm 5 tpm 6 tpm_reserve 7 budget 8 budget_reserve 9 day
#       10 cost_budget 11 cost_reserve (nano-dollars)
# -> {0, used, reserved} a slot | {1, used, reserved, ms to the oldest lease's expiry} queued |
#    {2, code, retry_ms, used, reserved} refused: code is a RULES code (gateway.limits.base.BY_CODE; for
#    the cost budget's, 5 and 6, used and reserved are the cost's); retry_ms is 0 where the rule fixes it |
#    {3} the day's budget counters are not seeded yet
ADMIT = Script(
    "admit",
    NOW
    + _EXPIRE_RESERVATIONS
    + """
local lid, lease = ARGV[1], tonumber(ARGV[2])
local budget, cbudget = tonumber(ARGV[7]), tonumber(ARGV[10])
local used, reserved = 0, 0
if budget > 0 or cbudget > 0 then
  if redis.call('EXISTS', KEYS[9]) == 0 then return {3} end
  local creserved
  reserved, creserved = expire_reservations(KEYS[3], KEYS[4], KEYS[5], KEYS[11], KEYS[12], now)
  if cbudget > 0 then
    local cused = tonumber(redis.call('GET', KEYS[10]) or 0)
    if cused + creserved >= cbudget then
      if cused >= cbudget then
        return {2, 5, math.max(1000, (tonumber(ARGV[9]) + 1) * 86400000 - now), cused, creserved}
      end
      return {2, 6, 0, cused, creserved}
    end
  end
end
if budget > 0 then
  used = tonumber(redis.call('GET', KEYS[8]) or 0)
  if used + reserved >= budget then
    if used >= budget then
      return {2, 1, math.max(1000, (tonumber(ARGV[9]) + 1) * 86400000 - now), used, reserved}
    end
    return {2, 2, 0, used, reserved}
  end
end
local rpm_tat, tpm_tat
local rpm = tonumber(ARGV[4])
if rpm > 0 then
  rpm_tat = math.max(tonumber(redis.call('GET', KEYS[6]) or 0), now) + 60000 / rpm
  if rpm_tat - now > 60000.001 then return {2, 3, math.ceil(rpm_tat - now - 60000), used, reserved} end
end
local tpm, reserve = tonumber(ARGV[5]), tonumber(ARGV[6])
if tpm > 0 then
  tpm_tat = math.max(tonumber(redis.call('GET', KEYS[7]) or 0), now) + reserve * 60000 / tpm
  if tpm_tat - now > 60000.001 then return {2, 4, math.ceil(tpm_tat - now - 60000), used, reserved} end
end
if rpm_tat then redis.call('SET', KEYS[6], tostring(rpm_tat), 'PX', math.ceil(rpm_tat - now) + 1000) end
if tpm_tat then redis.call('SET', KEYS[7], tostring(tpm_tat), 'PX', math.ceil(tpm_tat - now) + 1000) end
if budget > 0 then
  local br = tonumber(ARGV[8])
  reserved = redis.call('INCRBY', KEYS[5], br)
  redis.call('HSET', KEYS[4], lid, br)
end
if cbudget > 0 then
  redis.call('INCRBY', KEYS[12], ARGV[11])
  redis.call('HSET', KEYS[11], lid, ARGV[11])
end
if budget > 0 or cbudget > 0 then redis.call('ZADD', KEYS[3], now + lease, lid) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + lease, lid)
  return {0, used, reserved}
end
redis.call('ZADD', KEYS[2], now + lease, lid)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {1, used, reserved, math.floor(tonumber(first[2]) - now)}
""",
)

# A queued request tries again for a slot. KEYS: 1 slots 2 queue; ARGV: 1 lid 2 lease_ms 3 max_concurrency
# -> {0} a slot | {1, ms to the oldest lease's expiry}
SLOT = Script(
    "slot",
    NOW
    + """
local lid, lease = ARGV[1], tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZREM', KEYS[2], lid)
  redis.call('ZADD', KEYS[1], now + lease, lid)
  return {0}
end
redis.call('ZADD', KEYS[2], now + lease, lid)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {1, math.floor(tonumber(first[2]) - now)}
""",
)

# Release and/or settle. KEYS: 1 slots 2 queue 3 held 4 resamt 5 reserved 6 tpm 7 used(day)
# 8 cresamt 9 creserved 10 cost(day)
# ARGV: 1 lid 2 release 3 settle 4 tpm 5 tpm_reserve 6 actual 7 channel 8 project 9 count_used 10 used_ttl_s
# 11 actual cost (nano-dollars) 12 count_cost
# -> {the day's used tokens, the day's cost} after settling (-1: not counted)
SETTLE = Script(
    "settle",
    NOW
    + _EXPIRE_RESERVATIONS
    + """
local lid = ARGV[1]
if ARGV[2] == '1' and redis.call('ZREM', KEYS[1], lid) == 1 then
  if redis.call('ZCOUNT', KEYS[2], now, '+inf') > 0 then redis.call('PUBLISH', ARGV[7], ARGV[8]) end
end
local used, cused = -1, -1
if ARGV[3] == '1' then
  local tpm, actual = tonumber(ARGV[4]), tonumber(ARGV[6])
  local delta = actual - tonumber(ARGV[5])
  if tpm > 0 and delta ~= 0 then
    local tat = math.max(math.max(tonumber(redis.call('GET', KEYS[6]) or 0), now) + delta * 60000 / tpm, now)
    if tat > now then
      redis.call('SET', KEYS[6], tostring(tat), 'PX', math.ceil(tat - now) + 1000)
    else
      redis.call('DEL', KEYS[6])
    end
  end
  unreserve(lid, KEYS[4], KEYS[5])
  unreserve(lid, KEYS[8], KEYS[9])
  redis.call('ZREM', KEYS[3], lid)
  if ARGV[9] == '1' then
    if actual > 0 then
      used = redis.call('INCRBY', KEYS[7], actual)
      redis.call('EXPIRE', KEYS[7], ARGV[10])
    else
      used = tonumber(redis.call('GET', KEYS[7]) or 0)
    end
  end
  if ARGV[12] == '1' then
    if tonumber(ARGV[11]) > 0 then
      cused = redis.call('INCRBY', KEYS[10], ARGV[11])
      redis.call('EXPIRE', KEYS[10], ARGV[10])
    else
      cused = tonumber(redis.call('GET', KEYS[10]) or 0)
    end
  end
end
return {used, cused}
""",
)

# A request that was not admitted after all (queue timeout, cancelled): its queue place, rpm slot, tpm
# and budget reservations go back. KEYS: 1 queue 2 held 3 resamt 4 reserved 5 rpm 6 tpm 7 cresamt
# 8 creserved; ARGV: 1 lid 2 rpm 3 tpm 4 tpm_reserve
REFUND = Script(
    "refund",
    NOW
    + _EXPIRE_RESERVATIONS
    + """
local lid = ARGV[1]
redis.call('ZREM', KEYS[1], lid)
local function give_back(key, ms)
  local tat = tonumber(redis.call('GET', key) or 0)
  if tat > now then
    tat = math.max(tat - ms, now)
    if tat > now then redis.call('SET', key, tostring(tat), 'PX', math.ceil(tat - now) + 1000)
    else redis.call('DEL', key) end
  end
end
local rpm, tpm, reserve = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if rpm > 0 then give_back(KEYS[5], 60000 / rpm) end
if tpm > 0 and reserve > 0 then give_back(KEYS[6], reserve * 60000 / tpm) end
unreserve(lid, KEYS[3], KEYS[4])
unreserve(lid, KEYS[7], KEYS[8])
redis.call('ZREM', KEYS[2], lid)
return 0
""",
)
