-- upcoming.lua: the next messages of one shard to fall due after a cursor, in due
-- order, over both pending layouts and the held sets (see the prelude). Read-only.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] held streams
-- ARGV[1] the cursor's score (-1: from the start)   ARGV[2] the cursor's id
-- ARGV[3] at most this many messages
-- ARGV[4] only messages to this stream ("" = every stream)
-- ARGV[5] look at no more than this many messages in each source (a bound on the
--   call's time when a stream filter matches little)
-- returns: { { score, id, stream, held (1/0: due, and waiting in its held set) }, ... }
--   in (score, id) order, then the
--   frontier { score, id } up to which every source was read whole ({} when every
--   source that stopped early had found its `limit`, or ran out): past the frontier
--   the list may miss messages, so the caller cuts it there.
local after_score, after_id = tonumber(ARGV[1]), ARGV[2]
local limit, only, budget = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])

local function past_cursor(score, id)
  if score ~= after_score then return score > after_score end
  return id_less(after_id, id)
end
local function stream_of(body)
  if not body then return '' end
  local stream = body_stream(body)
  if stream then return stream end
  local msg = decode_body(body)
  return (msg and msg.stream) or ''
end

local found, frontier = {}, nil
local due_max = now_ms() * 10 + 9
-- Keeps the lowest frontier of the sources that stopped on their budget.
local function stopped_at(score, id)
  if not frontier or score < frontier[1] or (score == frontier[1] and id_less(id, frontier[2])) then
    frontier = { score, id }
  end
end

-- A sorted set (the hash layout's due set, or a held set) from the cursor on.
local function from_zset(key, held, stream_known)
  local got, looked, offset = 0, 0, 0
  local min = after_score < 0 and '-inf' or after_score
  while got < limit do
    local page = redis.call('ZRANGEBYSCORE', key, min, '+inf', 'WITHSCORES', 'LIMIT', offset, 100)
    if #page == 0 then return end
    for i = 1, #page, 2 do
      local id, score = page[i], tonumber(page[i + 1])
      if past_cursor(score, id) then
        looked = looked + 1
        local stream = stream_known or stream_of(redis.call('HGET', KEYS[2], id))
        if only == '' or stream == only then
          local waits = 0
          if held == 1 and score <= due_max then waits = 1 end
          found[#found + 1] = { score, id, stream, waits }
          got = got + 1
          if got >= limit then return end
        end
        if looked >= budget then return stopped_at(score, id) end
      end
    end
    offset = offset + 100
  end
end

from_zset(KEYS[1], 0, nil)
for _, stream in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if only == '' or stream == only then from_zset(held_key(KEYS[3], stream), 1, stream) end
end

-- The compact buckets, from the one the cursor falls in (and in it, from the first
-- message past the cursor), read a few at a time: a page needs its `limit`, not
-- whole buckets.
local P = pending_of(KEYS[1], KEYS[2])
if P.ix.n > 0 then
  local start
  if after_score >= 0 then start = bucket_of(P, after_score, after_id) end
  local from = start and ('[' .. start) or '-'
  local got, looked = 0, 0
  local done = false
  local first = true
  while not done do
    local floors = redis.call('ZRANGEBYLEX', P.q, from, '+', 'LIMIT', 0, 16)
    for _, floor in ipairs(floors) do
      local key = bucket_key(P, floor)
      local at = 0
      if first and start then at = bucket_search(key, after_score, after_id) end
      first = false
      while not done do
        local step = math.max(8, math.min(128, limit - got))
        local elems = redis.call('LRANGE', key, at, at + step - 1)
        for _, e in ipairs(elems) do
          local score, id, body = elem_parts(e)
          if past_cursor(score, id) then
            looked = looked + 1
            local stream = stream_of(body)
            if only == '' or stream == only then
              found[#found + 1] = { score, id, stream, 0 }
              got = got + 1
              if got >= limit then done = true break end
            end
            if looked >= budget then stopped_at(score, id) done = true break end
          end
        end
        if #elems < step then break end
        at = at + step
      end
      if done then break end
    end
    if #floors < 16 then break end
    from = '(' .. floors[#floors]
  end
end

table.sort(found, function(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  return id_less(a[2], b[2])
end)
local out = {}
for _, m in ipairs(found) do
  if #out >= limit then break end
  if frontier and (m[1] > frontier[1] or (m[1] == frontier[1] and id_less(frontier[2], m[2]))) then break end
  out[#out + 1] = { m[1], m[2], m[3], m[4] }
end
return { out, frontier and { frontier[1], frontier[2] } or {} }
