-- due_histogram.lua: how many of one shard's scheduled messages fall due in each of a
-- few time classes, over both pending layouts and the held sets (see the prelude).
-- Read-only.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] held streams
-- ARGV[1] where the walk of the compact buckets starts: "-" (at the first; the call
--   then counts the due set too) or the cursor a call returned
-- ARGV[2] the most buckets this call looks at: a large backlog is counted in calls of
--   bounded time, so that Redis is never held for long
-- ARGV[3..2+n] ascending scores: class i holds the messages scoring above the bound
--   before it and at most its own (class 1: at most the first)
-- returns: { count of class 1, ..., count of class n, count past the last bound,
--            earliest score (-1 = none; -1 in a later call), cursor ("" = counted whole) }
--   Summed over the calls of one walk, the counts are the shard's: the first call
--   puts every compact message past the last bound, and each call moves those of the
--   buckets it looked at into their classes (so the last count of a later call is
--   negative or 0).
-- Cost: the hash layout's ZCOUNTs, and one LLEN and LINDEX per compact bucket up to
-- the last bound (a bucket that straddles a bound is binary-searched once).
local from, budget = ARGV[1], tonumber(ARGV[2])
local bounds = {}
for i = 3, #ARGV do bounds[#bounds + 1] = tonumber(ARGV[i]) end
local n = #bounds
local counts = {}
for i = 1, n + 1 do counts[i] = 0 end

local P = pending_of(KEYS[1], KEYS[2])
local earliest = -1
if from == '-' then
  local prev = '-inf'
  for i = 1, n do
    counts[i] = redis.call('ZCOUNT', KEYS[1], prev, bounds[i])
    prev = '(' .. bounds[i]
  end
  counts[n + 1] = redis.call('ZCOUNT', KEYS[1], prev, '+inf') + P.ix.n
  local held, first = held_classes(KEYS[3], bounds, pending_first(P))
  for i = 1, n + 1 do counts[i] = counts[i] + held[i] end
  earliest = first or -1
end

-- How many elements of a bucket's list (len long) score at most max.
local function at_most(key, len, max)
  local lo, hi = 0, len
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if elem_score(redis.call('LINDEX', key, mid)) <= max then lo = mid + 1 else hi = mid end
  end
  return lo
end
-- A call after the first starts again at class 1: the classes its first bucket is
-- past cost one LINDEX of that bucket's head, not a search each.
local class, looked, cursor = 1, 0, ''
while class <= n and looked < budget do
  local page = math.min(64, budget - looked)
  local floors = redis.call('ZRANGEBYLEX', P.q, from, '+', 'LIMIT', 0, page)
  for _, floor in ipairs(floors) do
    looked = looked + 1
    local key = bucket_key(P, floor)
    local len = redis.call('LLEN', key)
    local last = elem_score(redis.call('LINDEX', key, -1))
    local first
    local taken = 0
    while class <= n do
      if last <= bounds[class] then
        counts[class] = counts[class] + len - taken
        taken = len
        break
      end
      first = first or elem_score(redis.call('LINDEX', key, 0))
      local upto = taken
      if first <= bounds[class] then upto = at_most(key, len, bounds[class]) end
      counts[class] = counts[class] + upto - taken
      taken = upto
      class = class + 1
    end
    counts[n + 1] = counts[n + 1] - taken
    if class > n then break end
  end
  if class > n or #floors < page then
    cursor = ''
    break
  end
  from = '(' .. floors[#floors]
  cursor = from
end
counts[n + 2] = earliest
counts[n + 3] = cursor
return counts
