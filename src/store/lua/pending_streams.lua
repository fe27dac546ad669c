-- pending_streams.lua: count a slice of one shard's scheduled messages by target
-- stream, for operators. Read-only; a full count takes several calls (HSCAN cursor),
-- so no single call holds Redis for long.
-- KEYS[1] bodies
-- ARGV[1] HSCAN cursor ("0" to start)
-- ARGV[2] how many bodies to look at (a hint, as HSCAN's COUNT)
-- returns: { next cursor ("0" = done), bodies looked at, { stream, count, ... } }
--   (bodies that cannot be decoded are counted under the stream "")
local reply = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local items = reply[2]
local counts, order = {}, {}
for k = 2, #items, 2 do
  local msg = decode_body(items[k])
  local stream = ''
  if msg then stream = msg.stream end
  if not counts[stream] then
    counts[stream] = 0
    order[#order + 1] = stream
  end
  counts[stream] = counts[stream] + 1
end
local flat = {}
for _, stream in ipairs(order) do
  flat[#flat + 1] = stream
  flat[#flat + 1] = counts[stream]
end
return { reply[1], #items / 2, flat }
