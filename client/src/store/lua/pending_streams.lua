-- pending_streams.lua: count a slice of one shard's scheduled messages by target
-- stream, for operators. Read-only; a full count takes several calls (a cursor), so
-- no single call holds Redis for long.
-- KEYS[1] bodies   KEYS[2] due set (both pending layouts are counted; see the prelude)
-- ARGV[1] cursor ("0" to start): an HSCAN cursor of the bodies hash while it is read,
--   then "q" and the hex of the next compact bucket's floor
-- ARGV[2] how many bodies to look at (a hint, as HSCAN's COUNT)
-- ARGV[3] the highest score that counts as due soon
-- returns: { next cursor ("0" = done), bodies looked at, { stream, count, soon, ... } }
--   where soon counts the messages scoring at most ARGV[3], held ones by the due
--   time their bodies keep (bodies that cannot be decoded are counted under the
--   stream "", and as soon when they have no score)
local counts, soon, order, seen = {}, {}, {}, 0
local soon_max = tonumber(ARGV[3])
-- score: a compact element's; for a body of the bodies hash, its score in the due
-- set (nil: it is held, and its body keeps its due time).
local function count(body, score)
  seen = seen + 1
  local stream = body_stream(body)
  if not stream or not score then
    local msg = decode_body(body, score)
    stream = (msg and msg.stream) or ''
    if msg and not score then score = score_of(msg.due, tonumber(msg.priority) or 0) end
  end
  if not counts[stream] then
    counts[stream], soon[stream] = 0, 0
    order[#order + 1] = stream
  end
  counts[stream] = counts[stream] + 1
  if not score or score <= soon_max then soon[stream] = soon[stream] + 1 end
end

local function hex(s)
  return (string.gsub(s, '.', function(c) return string.format('%02x', string.byte(c)) end))
end
local function unhex(h)
  return (string.gsub(h, '..', function(c) return string.char(tonumber(c, 16)) end))
end

local cursor = ARGV[1]
local step = tonumber(ARGV[2])
local next_cursor
if string.sub(cursor, 1, 1) ~= 'q' then
  local reply = redis.call('HSCAN', KEYS[1], cursor, 'COUNT', step)
  local items = reply[2]
  for k = 2, #items, 2 do
    local score = redis.call('ZSCORE', KEYS[2], items[k - 1])
    count(items[k], score and tonumber(score))
  end
  next_cursor = reply[1]
  if next_cursor == '0' then next_cursor = 'q' end
else
  local P = pending_of(KEYS[2], KEYS[1])
  local from = '-'
  if #cursor > 1 then from = '[' .. unhex(string.sub(cursor, 2)) end
  local want = math.max(1, math.floor(step / 64))
  local floors = redis.call('ZRANGEBYLEX', P.q, from, '+', 'LIMIT', 0, want + 1)
  for i = 1, math.min(want, #floors) do
    for _, e in ipairs(redis.call('LRANGE', bucket_key(P, floors[i]), 0, -1)) do
      local score, _, body = elem_parts(e)
      count(body, score)
    end
  end
  next_cursor = '0'
  if #floors > want then next_cursor = 'q' .. hex(floors[want + 1]) end
end

local flat = {}
for _, stream in ipairs(order) do
  flat[#flat + 1] = stream
  flat[#flat + 1] = counts[stream]
  flat[#flat + 1] = soon[stream]
end
return { next_cursor, seen, flat }
