-- ceiling.lua: the least Redis work that moves a batch of due messages into a
-- stream, for the benchmark's ceiling (not used by delayq itself).
-- KEYS[1] due set (id -> due ms)   KEYS[2] bodies (id -> payload)   KEYS[3] target stream
-- ARGV[1] batch size
-- returns: messages moved (0 when nothing is due)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #ids == 0 then return 0 end
local bodies = redis.call('HMGET', KEYS[2], unpack(ids))
for i, id in ipairs(ids) do
  redis.call('XADD', KEYS[3], '*', 'payload', bodies[i], 'delayq-id', id)
end
redis.call('HDEL', KEYS[2], unpack(ids))
redis.call('ZREM', KEYS[1], unpack(ids))
return #ids
