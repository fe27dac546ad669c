-- advance_schedule.lua: the leader records how far schedules' occurrences are made,
-- after it pushed them: each forward only, and only while its epoch holds shard 0's
-- fence.
-- KEYS[1] shard 0's fence   KEYS[2] the schedules' state hash (`<schedules>:state`)
-- KEYS[3] the schedules hash (a schedule deleted meanwhile is not brought back)
-- ARGV[1] epoch of the leader calling
-- ARGV[2..] four per schedule: id, the next occurrence the leader read (ms; 0: none
--   yet), the next occurrence not yet made (ms), and the rest of the state as text:
--   `<last occurrence made (ms, 0: none)> <occurrences missed so far>`
-- returns: one per schedule, in order: "advanced" | "moved" (another leader or a
--   change of the schedule went first: nothing written) | "gone" (deleted)
--   | error "FENCED ..."
local held = fenced(KEYS[1], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end
local out = {}
for i = 2, #ARGV, 4 do
  local id = ARGV[i]
  if not redis.call('HGET', KEYS[3], id) then
    redis.call('HDEL', KEYS[2], id)
    out[#out + 1] = 'gone'
  else
    local state = redis.call('HGET', KEYS[2], id)
    local next_read = '0'
    if state then next_read = string.match(state, '^(%d+)') or '0' end
    if next_read ~= ARGV[i + 1] then
      out[#out + 1] = 'moved'
    else
      redis.call('HSET', KEYS[2], id, ARGV[i + 2] .. ' ' .. ARGV[i + 3])
      out[#out + 1] = 'advanced'
    end
  end
end
return out
