-- inbox_take.lua: hand out the inbox entries from F to L as one marked read. The reader
-- read them with XRANGE, which hands nothing out; this call hands them out by moving
-- the group past them (XGROUP SETID), with the first and last of them that exist made
-- pending under a consumer named for the read, node .. '@' .. F .. '..' .. L. The
-- entries between are not pending one by one (see inbox_entries in
-- lua/prelude/15-inbox.lua): the schedule call that stores them all settles the read,
-- anything else releases it. Nothing is handed out unless the group's last delivered
-- id is still the one the reader read after, so a read races no other reader.
-- KEYS[1] inbox stream
-- ARGV[1] inbox consumer group
-- ARGV[2] the reader: its node id .. '@'
-- ARGV[3] the group's last delivered id the reader read after ("" = not known yet)
-- ARGV[4] F, the first entry read
-- ARGV[5] L, the last entry read
-- ARGV[6] how many entries the reader read from F to L: the group's count of entries
--   read grows by it, so that XINFO GROUPS still tells the inbox's lag
-- returns: { the read's consumer ("" when none of the entries is left), the group's last
--   delivered id now, 1 when this call moved it past L (else 0: another reader moved
--   it first) } | error NOGROUP (no group)
local inbox, group = KEYS[1], ARGV[1]
local mine = inbox_entries.groups(inbox)[group]
if not mine then return redis.error_reply('NOGROUP no group ' .. group .. ' on ' .. inbox) end
local delivered, entries_read = mine['last-delivered-id'], mine['entries-read']
if delivered ~= ARGV[3] or ARGV[4] == '' then return { '', delivered, 0 } end
local first, last = ARGV[4], ARGV[5]
local read = ARGV[2] .. first .. '..' .. last
local head = redis.call('XRANGE', inbox, first, last, 'COUNT', 1)[1]
if head then
  local tail = redis.call('XREVRANGE', inbox, last, first, 'COUNT', 1)[1]
  redis.call('XCLAIM', inbox, group, read, 0, head[1], tail[1], 'FORCE', 'JUSTID')
else
  read = ''
end
if type(entries_read) == 'number' then
  redis.call('XGROUP', 'SETID', inbox, group, last, 'ENTRIESREAD', entries_read + tonumber(ARGV[6]))
else
  redis.call('XGROUP', 'SETID', inbox, group, last)
end
return { read, last, 1 }
