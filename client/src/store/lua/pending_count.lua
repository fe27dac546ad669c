-- pending_count.lua: how many messages one shard has scheduled, how many of them are
-- due, and the earliest, over both pending layouts and the held sets (see the
-- prelude). Read-only.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] held streams
-- ARGV[1] where the walk of the compact buckets starts: "-" (at the first) or the
--   cursor a call returned
-- ARGV[2] the most buckets this call looks at: a backlog of due messages is counted
--   in calls of bounded time, so that Redis is never held for long
-- ARGV[3] the highest score that counts as due (now_ms * 10 + 9)
-- returns: { scheduled, due, earliest score (-1 = none), cursor ("" = counted whole) }
--   Summed over the calls of one walk, the counts are the shard's: the first call
--   ("-") gives scheduled, the earliest and the due set's due messages, every call
--   the due messages of the buckets it looked at (a later call: 0 scheduled, -1).
local from, budget, max = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local P = pending_of(KEYS[1], KEYS[2])
local scheduled, due, earliest = 0, 0, -1
if from == '-' then
  scheduled = redis.call('ZCARD', KEYS[1]) + P.ix.n
  due = redis.call('ZCOUNT', KEYS[1], '-inf', max)
  local held, first = held_classes(KEYS[3], { max }, pending_first(P))
  scheduled, due, earliest = scheduled + held[1] + held[2], due + held[1], first or -1
end
-- Buckets are in order: every one up to the first that ends past max is due whole.
local upto, looked, cursor = '(' .. score_bytes(max + 1), 0, ''
while looked < budget do
  local page = math.min(64, budget - looked)
  local floors = redis.call('ZRANGEBYLEX', P.q, from, upto, 'LIMIT', 0, page)
  local ended = #floors < page
  for _, floor in ipairs(floors) do
    looked = looked + 1
    local key = bucket_key(P, floor)
    local last = redis.call('LINDEX', key, -1)
    if last and elem_score(last) <= max then
      due = due + redis.call('LLEN', key)
    elseif last then
      -- The first element past max: its id is any that sorts after every id.
      local lo, hi = 0, redis.call('LLEN', key)
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if elem_score(redis.call('LINDEX', key, mid)) <= max then lo = mid + 1 else hi = mid end
      end
      due = due + lo
      ended = true
      break
    end
  end
  if ended then
    cursor = ''
    break
  end
  from = '(' .. floors[#floors]
  cursor = from
end
return { scheduled, due, earliest, cursor }
