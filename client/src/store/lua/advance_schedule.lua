-- advance_schedule.lua: the leader records how far a schedule's occurrences are made,
-- after it pushed them: forward only, and only while its epoch holds shard 0's fence.
-- KEYS[1] shard 0's fence   KEYS[2] the schedules' state hash (`<schedules>:state`)
-- KEYS[3] the schedules hash (a schedule deleted meanwhile is not brought back)
-- ARGV[1] epoch of the leader calling
-- ARGV[2] schedule id   ARGV[3] the next occurrence the leader read (ms; 0: none yet)
-- ARGV[4] the next occurrence not yet made (ms)   ARGV[5] the last occurrence made (ms, 0: none)
-- returns: "advanced" | "moved" (another leader advanced it first: nothing written)
--        | "gone" (the schedule was deleted) | error "FENCED ..."
local held = fenced(KEYS[1], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end
local id = ARGV[2]
if not redis.call('HGET', KEYS[3], id) then
  redis.call('HDEL', KEYS[2], id)
  return 'gone'
end
local state = redis.call('HGET', KEYS[2], id)
local next_read = '0'
if state then next_read = string.match(state, '^(%d+)') or '0' end
if next_read ~= ARGV[3] then return 'moved' end
redis.call('HSET', KEYS[2], id, ARGV[4] .. ' ' .. ARGV[5])
return 'advanced'
