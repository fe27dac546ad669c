-- restore_schedule.lua: puts a schedule back from the journal (a restore after Redis
-- lost its data): its definition and how far it was made in one step, so that no
-- reader (the leader making occurrences, the API) finds it without how far it was
-- made, which would make those occurrences again. One Redis already holds is left
-- as it is.
-- KEYS[1] the schedules hash   KEYS[2] the schedules' state hash (`<schedules>:state`)
-- KEYS[3] the definitions' version counter (`<schedules>:version`)
-- ARGV[1] id   ARGV[2] the definition (JSON)
-- ARGV[3] how far it was made, as advance_schedule.lua writes it: `<next occurrence
--   not yet made (ms)> <last made (ms)> <missed>`; "" = nothing made yet
-- returns: 1 restored | 0 already there (nothing written)
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[3]) end
redis.call('INCR', KEYS[3])
return 1
