-- trim.lua: forget terminal records whose retention has passed.
-- KEYS[1] records   KEYS[2] records by expiry   KEYS[3] fence
-- ARGV[1] epoch of the leader calling
-- ARGV[2] most records to forget in this call
-- returns: number of records forgotten | error "FENCED ..."
local held = fenced(KEYS[3], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[2]))
if #ids > 0 then
  redis.call('HDEL', KEYS[1], unpack(ids))
  redis.call('ZREM', KEYS[2], unpack(ids))
end
return #ids
