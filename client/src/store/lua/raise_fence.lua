-- raise_fence.lua: a new leader raises the shard's fence to its epoch before it moves
-- anything, so an older leader's next script call is refused.
-- KEYS[1] fence
-- ARGV[1] epoch of the new leader
-- returns: the epoch now held | error "FENCED ..." if a newer leader already holds the fence
local held = fenced(KEYS[1], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end
return tonumber(redis.call('GET', KEYS[1]))
