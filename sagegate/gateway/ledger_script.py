"""The shared ledger's one Redis script: renew a lease, publish, check-and-charge, read.

Every call of a replica runs this script once (atomically: Redis runs one script at a time), so a
check-and-charge sees every replica's charges as they stand and no two replicas can both take the
same room. Keys (under ``prefix``):

* ``{prefix}:members`` — a sorted set: replica id → its lease deadline (ms, Redis's clock). A replica
  past its deadline is dropped at the next call of anyone.
* ``{prefix}:c:{replica}:{backend}`` — that replica's charges on that backend, packed as
  ``"held:remaining,"`` per charge (one string: one read per replica and backend, no per-charge
  reply), with the lease as its TTL, so a dead replica's charges vanish from Redis too. A publish
  replaces it whole (progress, releases); an accepted commit appends to it.

The rule is ``policies.admission.BackendLoad.admits`` over every live replica's charges and the
committing replica's ``pinned`` tokens (prompt blocks whose payer left while others still use them,
``policies.resident``: charged to the backend, not to a request): an idle backend admits anything;
rule ``sum`` admits while the footprints and the pinned tokens stay within ``limit``; rule ``peak``
while the most KV the charges will hold at once (``Holdings``: sorted by remaining, longest first, the
peak is ``max_k S_k + k·r_k``) stays within ``limit`` less the pinned tokens
(``tests/gateway/test_ledger_rule.py`` holds the two equal). The keys are computed in the script, so
it suits one Redis server (or a cluster with every ledger key in one slot), not a sharded cluster.

* ``{prefix}:p:{replica}:{backend}`` — ``"n:tokens"``: the requests that replica sent to that
  backend since its last scrape began (its ``pending``), with the lease as TTL; a read returns the
  other replicas' sums per backend (``pending``), which they count as waiting there.
* ``{prefix}:freed`` — a pub/sub channel: a call that publishes a release announces it there (the
  replica's id), and every other replica reads the ledger at once.
* ``{prefix}:h:{replica}`` — that replica's published queue head (``ledger.order: threshold``), JSON
  ``[key, held, remaining, prompt]``, with the lease as its TTL.

ARGV[1] is JSON: ``{"replica", "lease_ms", "prefix", "backends": [names], "publish": {backend:
packed}, "commit": [[backend, held, remaining, limit, rule, pinned]], "read": bool, "head": [...] |
[] (optional: publish this head, or none), "freed": bool (a release is among the published),
"check": {backend: [limit, rule, pinned]} (optional: backends where this replica sent first,
``ledger.send_first_share``)}``.
Returns JSON: ``{"ok": [1 | 0 per commit], "others": {backend: packed}, "heads": [every other live
replica's head], "over": [checked backends whose charges, every replica's, exceed the limit],
"members": live replicas}``; ``others`` (every other live replica's charges, concatenated) is filled
when ``read``, when a commit was denied or when a checked backend is over, ``heads`` when ``read`` and
a head was given.
"""

from __future__ import annotations

LEDGER_LUA = r"""
local a = cjson.decode(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local members = a.prefix .. ':members'
redis.call('ZREMRANGEBYSCORE', members, '-inf', now)
redis.call('ZADD', members, now + a.lease_ms, a.replica)
redis.call('PEXPIRE', members, a.lease_ms * 4)
local live = redis.call('ZRANGE', members, 0, -1)

local function key(replica, backend) return a.prefix .. ':c:' .. replica .. ':' .. backend end

for backend, packed in pairs(a.publish) do
  local k = key(a.replica, backend)
  if packed == '' then redis.call('DEL', k) else redis.call('SET', k, packed, 'PX', a.lease_ms) end
end

local function packed_on(backend, others_only)
  local parts = {}
  for _, m in ipairs(live) do
    if not (others_only and m == a.replica) then
      local v = redis.call('GET', key(m, backend))
      if v then parts[#parts + 1] = v end
    end
  end
  return table.concat(parts)
end

local function book_of(backend)  -- every live replica's charges there, as they stand
  local book = {list = {}, total = 0}
  for hs, rs in string.gmatch(packed_on(backend, false), '(%d+):(%d+),') do
    local hh, rr = tonumber(hs), tonumber(rs)
    book.list[#book.list + 1] = {hh, rr}
    book.total = book.total + hh + rr
  end
  return book
end

local function fits(book, h, r, limit, rule, pinned)
  if book.total + pinned <= 0 then return true end
  if book.total + pinned + h + r <= limit then return true end
  if rule == 'sum' then return false end
  local all = {}
  for i = 1, #book.list do all[i] = book.list[i] end
  all[#all + 1] = {h, r}
  table.sort(all, function(x, y) return x[2] > y[2] end)
  local s, peak = 0, 0
  for k = 1, #all do
    s = s + all[k][1]
    local p = s + k * all[k][2]
    if p > peak then peak = p end
  end
  return peak <= limit - pinned
end

local ok, books, denied = {}, {}, false
for i, c in ipairs(a.commit) do
  local backend, h, r, limit, rule, pinned = c[1], c[2], c[3], c[4], c[5], c[6] or 0
  local book = books[backend]
  if book == nil then
    book = book_of(backend)
    books[backend] = book
  end
  if fits(book, h, r, limit, rule, pinned) then
    redis.call('APPEND', key(a.replica, backend), h .. ':' .. r .. ',')
    book.list[#book.list + 1] = {h, r}
    book.total = book.total + h + r
    ok[i] = 1
  else
    ok[i] = 0
    denied = true
  end
end

for _, backend in ipairs(a.backends) do
  redis.call('PEXPIRE', key(a.replica, backend), a.lease_ms)
end

local heads = {}
if a.head ~= nil then
  local hk = a.prefix .. ':h:' .. a.replica
  if #a.head == 0 then
    redis.call('DEL', hk)
  else
    redis.call('SET', hk, cjson.encode(a.head), 'PX', a.lease_ms)
  end
  if a.read then
    for _, m in ipairs(live) do
      if m ~= a.replica then
        local v = redis.call('GET', a.prefix .. ':h:' .. m)
        if v then heads[#heads + 1] = cjson.decode(v) end
      end
    end
  end
end

if a.freed then  -- a release in this call: the others read at once instead of at their next sync
  redis.call('PUBLISH', a.prefix .. ':freed', a.replica)
end

-- what this replica has sent since its last scrape, per backend ("n:tokens"): the others count it
-- as waiting there until their own scrapes can see it
if a.pending ~= nil then
  for backend, np in pairs(a.pending) do
    redis.call('SET', a.prefix .. ':p:' .. a.replica .. ':' .. backend, np, 'PX', a.lease_ms)
  end
end

-- sent first (``check``): the fleet's charges on that backend, ours as just published included,
-- against the rule's limit; a backend over it is reported, and the answer carries a fresh view
local over = {}
if a.check ~= nil then
  for backend, lr in pairs(a.check) do
    local book = book_of(backend)
    if #book.list > 1 and not fits(book, 0, 0, lr[1], lr[2], lr[3] or 0) then
      over[#over + 1] = backend
      denied = true
    end
  end
end

local others, pending = {}, {}
if a.read or denied then
  for _, backend in ipairs(a.backends) do
    local packed = packed_on(backend, true)
    if packed ~= '' then others[backend] = packed end
    local n, t = 0, 0
    for _, m in ipairs(live) do
      if m ~= a.replica then
        local v = redis.call('GET', a.prefix .. ':p:' .. m .. ':' .. backend)
        if v then
          local pn, pt = string.match(v, '(%d+):(%d+)')
          n, t = n + tonumber(pn), t + tonumber(pt)
        end
      end
    end
    if n > 0 then pending[backend] = n .. ':' .. t end
  end
end
return cjson.encode({
  ok = ok, others = others, heads = heads, pending = pending, over = over, members = #live
})
"""
