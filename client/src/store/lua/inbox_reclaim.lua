-- inbox_reclaim.lua: take over inbox entries whose reader is gone: each entry pending
-- (read and not yet stored or rejected) and idle at least ARGV[3] ms, from ARGV[4] on.
-- An entry pending on its own is claimed, handed out once more; a marked read's end
-- (lua/inbox_take.lua) releases its whole read, each entry handed out once more than
-- its ends were (see inbox_entries.release in lua/prelude/15-inbox.lua).
-- KEYS[1] inbox stream
-- ARGV[1] inbox consumer group
-- ARGV[2] the consumer taking them over
-- ARGV[3] least idle time, ms
-- ARGV[4] where the scan starts: "-", or "(" .. the last id the scan saw
-- ARGV[5] most pending entries to look at
-- returns: { where the next scan starts ("" when this one reached the end), the entries
--   taken over, as XRANGE answers them: read here, in the call that takes them over, so
--   that a reader that stores them meanwhile cannot make them look deleted }
local inbox, group, to, idle = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
if not inbox_entries.groups(inbox)[group] then return { '', {} } end
local pending = redis.call('XPENDING', inbox, group, 'IDLE', idle, ARGV[4], '+', tonumber(ARGV[5]))
local taken, released = {}, {}
for _, e in ipairs(pending) do
  local id, consumer, count = e[1], e[2], e[4]
  if inbox_entries.range(consumer) then
    if not released[consumer] then
      released[consumer] = true
      for _, r in ipairs(inbox_entries.release(inbox, group, consumer, to, 1, idle)) do taken[#taken + 1] = r end
    end
  else
    for _, r in ipairs(redis.call('XCLAIM', inbox, group, to, idle, id, 'RETRYCOUNT', count + 1)) do
      if type(r) == 'table' then taken[#taken + 1] = r end
    end
  end
end
local next = ''
if #pending == tonumber(ARGV[5]) then next = '(' .. pending[#pending][1] end
return { next, taken }
