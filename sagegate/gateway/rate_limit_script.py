"""The rate-limit rule inside Redis (``gateway.rate_limit_rule`` says it in Python; a test holds them
equal). Per tenant, two keys under one hash tag:

- ``counts``, a hash of ``r:{minute}`` and ``t:{minute}``: requests and tokens charged per fixed minute,
  kept ``COUNTS_TTL_S`` after its last change (older minutes deleted as they pass);
- ``slots``, a sorted set of leases: one member per request admitted and not ended, scored by its
  expiry. Its holder renews it while the request runs; a missed release (a replica killed, Redis
  stalled) frees itself when the lease lapses. The set lives a lease past its last change.

``ACQUIRE_LUA`` decides and, admitted, charges the request (its prompt and its output cap) to the
current minute and takes a lease; ``SETTLE_LUA`` gives the lease back and, if it still held it, the
unused part of the charge (once: a settle repeated after a timeout refunds nothing more);
``RENEW_LUA`` extends leases. Atomic, so every replica counts against the same numbers. ``now`` is
Redis's clock unless given (tests)."""

from __future__ import annotations

from sagegate.gateway.rate_limit_rule import COUNTS_TTL_S, RETRY_MARGIN_S, TOO_LARGE, WINDOW_S

_COMMON = f"""
local h, slots = KEYS[1], KEYS[2]
local now
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) + tonumber(t[2]) / 1e6 end
local lease = tonumber(ARGV[2])
local W = {WINDOW_S!r}
local minute = math.floor(now / W)
local into = (now - minute * W) / W
local function num(f) return tonumber(redis.call('HGET', h, f) or '0') end
redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)  -- lapsed leases: their refunds are lost
local function forget_old()
  local names = redis.call('HKEYS', h)
  for i = 1, #names do
    local m = tonumber(string.sub(names[i], 3))
    if m == nil or m < minute - 1 then redis.call('HDEL', h, names[i]) end
  end
end
local function keep()
  if redis.call('EXISTS', h) == 1 then redis.call('EXPIRE', h, {COUNTS_TTL_S}) end
  if redis.call('EXISTS', slots) == 1 then redis.call('EXPIRE', slots, math.ceil(lease) + 1) end
end
"""

ACQUIRE_LUA = (
    _COMMON
    + f"""
local slot, rpm, tpm, conc = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local prompt, charge = tonumber(ARGV[7]), tonumber(ARGV[8])
if tpm > 0 and prompt > tpm then return {{0, '{TOO_LARGE}', 0}} end
local function wait_for(prev, curr, room)
  local s
  if curr <= room then s = ((1.0 - (room - curr) / prev) - into) * W
  else s = (1.0 - into) * W + (1.0 - room / curr) * W end
  return math.max(1, math.ceil(s + {RETRY_MARGIN_S!r}))
end
forget_old()
local rp, rc = num('r:' .. (minute - 1)), num('r:' .. minute)
local tp, tc = num('t:' .. (minute - 1)), num('t:' .. minute)
local kind, wait = '', 0
if rpm > 0 and rp * (1.0 - into) + rc + 1 > rpm then kind, wait = 'requests', wait_for(rp, rc, rpm - 1) end
if tpm > 0 and tp * (1.0 - into) + tc + prompt > tpm then
  if kind == '' then kind = 'tokens' end
  wait = math.max(wait, wait_for(tp, tc, tpm - prompt))
end
if kind ~= '' then return {{0, kind, wait}} end
if conc > 0 and redis.call('ZCARD', slots) + 1 > conc then return {{0, 'concurrent', 1}} end
redis.call('HINCRBY', h, 'r:' .. minute, 1)
redis.call('HINCRBY', h, 't:' .. minute, charge)
redis.call('ZADD', slots, now + lease, slot)
keep()
return {{1, minute}}
"""
)

SETTLE_LUA = (
    _COMMON
    + """
local slot, refund, charged = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('ZREM', slots, slot) == 1 then
  forget_old()
  if refund > 0 and charged >= minute - 1 then
    local f = 't:' .. charged
    local v = num(f)
    if v > 0 then redis.call('HINCRBY', h, f, -math.min(refund, v)) end
  elseif refund < 0 then
    redis.call('HINCRBY', h, 't:' .. minute, -refund)
  end
end
keep()
return 1
"""
)

RENEW_LUA = (
    _COMMON
    + """
for i = 3, #ARGV do redis.call('ZADD', slots, now + lease, ARGV[i]) end
keep()
return 1
"""
)
