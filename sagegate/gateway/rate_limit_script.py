"""The rate-limit rule inside Redis (``gateway.rate_limit_rule`` says it in Python; a test holds
them equal): one hash per tenant (``r:{minute}``, ``t:{minute}`` counts, ``c:{replica}`` requests
in flight) and one sorted set of live replicas (score: lease expiry). ``RELEASE_LUA`` adds output
tokens (as they stream) and, when its request is done, gives its place back. Atomic, so every replica
counts against the same numbers. ``now`` is Redis's clock unless given (tests)."""

from __future__ import annotations

_COMMON = """
local h, live = KEYS[1], KEYS[2]
local replica = ARGV[1]
local now
if ARGV[2] ~= '' then now = tonumber(ARGV[2]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) + tonumber(t[2]) / 1e6 end
local lease = tonumber(ARGV[3])
local minute = math.floor(now / 60)
local into = (now - minute * 60) / 60
local function num(f) return tonumber(redis.call('HGET', h, f) or '0') end
redis.call('ZADD', live, now + lease, replica)
"""

ACQUIRE_LUA = (
    _COMMON
    + """
local rpm, tpm, conc, prompt = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local function wait_for(prev, curr, room)
  if curr > room or prev <= 0 then return math.max(1, math.ceil((1 - into) * 60)) end
  local need = 1 - (room - curr) / prev
  return math.max(1, math.ceil((need - into) * 60))
end
local rp, rc = num('r:' .. (minute - 1)), num('r:' .. minute)
local tp, tc = num('t:' .. (minute - 1)), num('t:' .. minute)
if rpm > 0 and rp * (1 - into) + rc + 1 > rpm then return {0, 'requests', wait_for(rp, rc, rpm - 1)} end
if tpm > 0 and tp * (1 - into) + tc >= tpm then return {0, 'tokens', wait_for(tp, tc, tpm - 1)} end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', live, '-inf', now)
  local fields, running = redis.call('HGETALL', h), 0
  for i = 1, #fields, 2 do
    local f = fields[i]
    if string.sub(f, 1, 2) == 'c:' then
      if redis.call('ZSCORE', live, string.sub(f, 3)) then running = running + tonumber(fields[i + 1])
      else redis.call('HDEL', h, f) end
    end
  end
  if running + 1 > conc then return {0, 'concurrent', 1} end
end
redis.call('HINCRBY', h, 'r:' .. minute, 1)
redis.call('HINCRBY', h, 't:' .. minute, prompt)
redis.call('HINCRBY', h, 'c:' .. replica, 1)
redis.call('HDEL', h, 'r:' .. (minute - 2), 't:' .. (minute - 2))
redis.call('EXPIRE', h, math.max(180, math.ceil(lease * 2)))
return {1}
"""
)

RELEASE_LUA = (
    _COMMON
    + """
local output, done = tonumber(ARGV[4]), ARGV[5] == '1'
if done and num('c:' .. replica) > 0 then redis.call('HINCRBY', h, 'c:' .. replica, -1) end
if output > 0 then redis.call('HINCRBY', h, 't:' .. minute, output) end
redis.call('EXPIRE', h, math.max(180, math.ceil(lease * 2)))
return 1
"""
)

RENEW_LUA = _COMMON + "\nreturn 1\n"
