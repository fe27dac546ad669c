-- inbox_release.lua: release a marked read of the inbox (lua/inbox_take.lua) that is not
-- stored whole by one schedule call: every entry of its range becomes pending one by one
-- (see inbox_entries.release in lua/prelude/15-inbox.lua), all at once.
-- KEYS[1] inbox stream
-- ARGV[1] inbox consumer group
-- ARGV[2] the read's consumer
-- ARGV[3] the consumer its entries become pending for
-- ARGV[4] hand-outs to add to its ends' count: 0 (its own reader) | 1 (taken over)
-- ARGV[5] least idle time of its ends, ms (0: any)
-- returns: the ids of the entries now pending for ARGV[3], in order (none when the read
--   was settled or released already, or its ends are younger than ARGV[5])
if not inbox_entries.groups(KEYS[1])[ARGV[1]] then return {} end
local ids = {}
for i, e in ipairs(inbox_entries.release(KEYS[1], ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]),
  tonumber(ARGV[5]))) do ids[i] = e[1] end
return ids
