-- 50-held.lua: due scores and the held sets of rate-limited streams. Gives score_of,
-- held_key, held_classes, unhold, unhold_message.
--
-- Due set score: due_ms * 10 + (9 - priority), so equal due times go higher priority first.
-- Held (streams.max_rate): a due message of a stream at its rate limit waits in that
--   stream's held set, `<held>:<stream>`, a sorted set scored like the due set, and the
--   stream is a member of the shard's held set while it holds any. A held message keeps
--   its body in the bodies hash (with its due time): it is scheduled, only not in the
--   pending layouts. forward.lua holds and releases. Messages stored for a stream
--   kept apart (a limited one, as the caller's arguments say: pushed in
--   schedule_batch.lua, rescheduled, redelivered, replayed; pending_add_apart) go to
--   its held set, due or not: only those scoring at most now are held back; the
--   others wait for their time there, and every reader counts them by their score.


local function score_of(due, priority)
  return due * 10 + (9 - priority)
end

local function held_key(held, stream)
  return held .. ':' .. stream
end

-- A shard's held sets (held: its set of held streams) counted by score: counts[i] the
-- messages scoring above bounds[i - 1] and at most bounds[i], counts[#bounds + 1] those
-- past the last bound; and the earliest of their scores and `earliest` (nil: none).
local function held_classes(held, bounds, earliest)
  local counts = {}
  for i = 1, #bounds + 1 do counts[i] = 0 end
  for _, stream in ipairs(redis.call('SMEMBERS', held)) do
    local key, prev = held_key(held, stream), '-inf'
    for i, bound in ipairs(bounds) do
      counts[i] = counts[i] + redis.call('ZCOUNT', key, prev, bound)
      prev = '(' .. bound
    end
    counts[#bounds + 1] = counts[#bounds + 1] + redis.call('ZCOUNT', key, prev, '+inf')
    local first = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
    if first and (not earliest or first < earliest) then earliest = first end
  end
  return counts, earliest
end

-- Takes id out of stream's held set; returns whether it was there.
local function unhold(held, stream, id)
  local key = held_key(held, stream)
  if redis.call('ZREM', key, id) == 0 then return false end
  if redis.call('EXISTS', key) == 0 then redis.call('SREM', held, stream) end
  return true
end

-- Takes id out of the held set of the stream its body names; returns whether it was there.
local function unhold_message(bodies, held, id)
  local body = redis.call('HGET', bodies, id)
  if not body then return false end
  local msg = decode_body(body)
  return msg ~= nil and unhold(held, msg.stream, id)
end
