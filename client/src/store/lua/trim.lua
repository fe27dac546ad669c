-- trim.lua: forget terminal records whose retention has passed, and prune the
-- shard's key index.
-- KEYS[1] records   KEYS[2] records by expiry (the hash layout's)   KEYS[3] fence
-- KEYS[4] due set   KEYS[5] bodies
-- ARGV[1] epoch of the leader calling
-- ARGV[2] how many records to look at in this call, about (a bucket is taken whole,
--   and counts as RECORD_LOAD records; a hash layout's batch entry is taken whole)
-- returns: { records forgotten, records looked at, key index entries dropped, ids the
--   finished lists dropped, 1 when they may have more to drop (else 0) }
--   | error "FENCED ..."
-- Streams' finished lists (35-finished.lua) lose the ids at their heads no longer on
-- record. The key index (see 80-keys.lua) is pruned KEY_PRUNE_BUCKETS buckets of one stream's a
-- call, going round: an id whose message is neither pending nor on record leaves it.
-- A generation past its time (see the prelude) is forgotten at once: it leaves the
-- generations, so no script reads it again, and its n records count as forgotten. Its
-- buckets are deleted from then on, a few per call. The hash layout's expiry entries
-- list the ids recorded at one instant; an id whose record is gone, or was written
-- again at another instant, is left alone.
local held = fenced(KEYS[3], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local budget = tonumber(ARGV[2])
local now = now_ms()
local forgotten, looked = 0, 0

local gens_key, gone_key = KEYS[1] .. ':gens', KEYS[1] .. ':gone'
for _, gen in ipairs(record_gens(KEYS[1])) do
  if gen.untl <= now then
    forgotten = forgotten + gen.n
    redis.call('HSET', gone_key, gen.start, 2 ^ gen.k + gen.s)
    redis.call('HDEL', gens_key, gen.start)
  end
end
local gone = redis.call('HGETALL', gone_key)
for i = 1, #gone, 2 do
  if looked >= budget then break end
  local start, left = gone[i], tonumber(gone[i + 1])
  local take = math.min(left, math.max(1, math.ceil((budget - looked) / RECORD_LOAD)))
  local names = {}
  for b = left - take, left - 1 do names[#names + 1] = KEYS[1] .. ':' .. start .. ':' .. b end
  chunked({ 'DEL' }, names)
  looked = looked + take * RECORD_LOAD
  if take == left then
    redis.call('HDEL', gone_key, start)
  else
    redis.call('HSET', gone_key, start, left - take)
  end
end

local entries = {}
if looked < budget then
  entries = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, budget - looked)
end
local done = {}
for _, entry in ipairs(entries) do
  if looked >= budget then break end
  local bar = string.find(entry, '|', 1, true)
  if not bar then
    -- The oldest layout: the entry is the id itself.
    forgotten = forgotten + redis.call('HDEL', KEYS[1], entry)
    looked = looked + 1
  else
    local at = string.sub(entry, 1, bar - 1)
    local ids = {}
    for id in string.gmatch(string.sub(entry, bar + 1), '[^\n]+') do ids[#ids + 1] = id end
    local recs = chunked({ 'HMGET', KEYS[1] }, ids)
    local gone = {}
    for i, id in ipairs(ids) do
      if recs[i] and string.match(recs[i], '^[^\n]*\n[^\n]*\n([^\n]*)') == at then gone[#gone + 1] = id end
    end
    forgotten = forgotten + chunked({ 'HDEL', KEYS[1] }, gone)
    looked = looked + #ids
  end
  done[#done + 1] = entry
end
chunked({ 'ZREM', KEYS[2] }, done)

-- About 160 ids a call: a few hundred microseconds of Redis time at most.
local KEY_PRUNE_BUCKETS = 4
local pruned = key_prune(KEYS[4], KEYS[5], KEYS[1], KEY_PRUNE_BUCKETS)

-- Up to 8 streams' finished lists (see 35-finished.lua, streams picked at random) lose
-- the ids at their heads that are no longer on record, up to FINISHED_TRIM a call; the
-- first id still on record stops a list (a list is in the order records were written).
local FINISHED_TRIM, LOOK = 256, 32
local unlisted = 0
for _, listed in ipairs(redis.call('HRANDFIELD', finished.streams(KEYS[1]), 8)) do
  local list = finished.list(KEYS[1], listed)
  local more, popped = true, 0
  while more and unlisted < FINISHED_TRIM do
    local look = math.min(LOOK, FINISHED_TRIM - unlisted)
    local head = redis.call('LRANGE', list, 0, look - 1)
    local n = 0
    for _, id in ipairs(head) do
      if find_record(KEYS[1], id) then
        more = false
        break
      end
      n = n + 1
    end
    if n > 0 then redis.call('LPOP', list, n) end
    popped, unlisted = popped + n, unlisted + n
    if #head < look then more = false end
  end
  if redis.call('EXISTS', list) == 0 then
    redis.call('HDEL', finished.streams(KEYS[1]), listed)
  elseif popped > 0 then
    redis.call('HINCRBY', finished.streams(KEYS[1]), listed, popped)
  end
end
return { forgotten, looked, pruned, unlisted, unlisted >= FINISHED_TRIM and 1 or 0 }
