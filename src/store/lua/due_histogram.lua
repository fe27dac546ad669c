-- due_histogram.lua: how many of one shard's scheduled messages fall due in each of a
-- few time classes, over both pending layouts (see the prelude). Read-only. Held
-- messages are not counted (the held sets are: they are all due already).
-- KEYS[1] due set   KEYS[2] bodies
-- ARGV[1..n] ascending scores: class i holds the messages scoring above ARGV[i-1] and
--   at most ARGV[i] (class 1: at most ARGV[1])
-- returns: { count of class 1, ..., count of class n, count past ARGV[n] }
-- Cost: the hash layout's ZCOUNTs, and one LLEN and LINDEX per compact bucket up to
-- the last bound (a bucket that straddles a bound is binary-searched once).
local bounds = {}
for i = 1, #ARGV do bounds[i] = tonumber(ARGV[i]) end
local n = #bounds
local counts = {}
local prev = '-inf'
for i = 1, n do
  counts[i] = redis.call('ZCOUNT', KEYS[1], prev, bounds[i])
  prev = '(' .. bounds[i]
end
counts[n + 1] = redis.call('ZCOUNT', KEYS[1], prev, '+inf')

local P = pending_of(KEYS[1], KEYS[2])
-- How many elements of a bucket's list (len long) score at most max.
local function at_most(key, len, max)
  local lo, hi = 0, len
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if elem_score(redis.call('LINDEX', key, mid)) <= max then lo = mid + 1 else hi = mid end
  end
  return lo
end
local class, counted, from = 1, 0, '-'
while class <= n do
  local floors = redis.call('ZRANGEBYLEX', P.q, from, '+', 'LIMIT', 0, 64)
  for _, floor in ipairs(floors) do
    local key = bucket_key(P, floor)
    local len = redis.call('LLEN', key)
    local last = elem_score(redis.call('LINDEX', key, -1))
    local taken = 0
    while class <= n do
      if last <= bounds[class] then
        counts[class] = counts[class] + len - taken
        taken = len
        break
      end
      local upto = at_most(key, len, bounds[class])
      counts[class] = counts[class] + upto - taken
      taken = upto
      class = class + 1
    end
    counted = counted + taken
    if class > n then break end
  end
  if #floors < 64 then break end
  from = '(' .. floors[#floors]
end
-- Whatever the buckets hold past the last bound (or past the buckets read).
counts[n + 1] = counts[n + 1] + P.ix.n - counted
return counts
