-- pending_count.lua: how many messages one shard has scheduled, how many of them are
-- due, and the earliest, over both pending layouts (see the prelude). Read-only.
-- Held messages are not counted (the held sets are).
-- KEYS[1] due set   KEYS[2] bodies
-- ARGV[1] the highest score that counts as due (now_ms * 10 + 9)
-- returns: { scheduled, due, earliest score (-1 = none) }
local max = tonumber(ARGV[1])
local P = pending_of(KEYS[1], KEYS[2])
local scheduled = redis.call('ZCARD', KEYS[1]) + P.ix.n
local due = redis.call('ZCOUNT', KEYS[1], '-inf', max)
-- Buckets are in order: every one up to the first that ends past max is due whole.
local from = '-'
while true do
  local floors = redis.call('ZRANGEBYLEX', P.q, from, '(' .. score_bytes(max + 1), 'LIMIT', 0, 64)
  for _, floor in ipairs(floors) do
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
      floors = {}
      break
    end
  end
  if #floors < 64 then break end
  from = '(' .. floors[#floors]
end
return { scheduled, due, pending_first(P) or -1 }
