-- reject_inbox.lua: move inbox entries that cannot be scheduled to the rejected stream,
-- each with its reason and original fields, and acknowledge (and delete) them, in one
-- atomic call: an entry leaves the inbox exactly when its rejection is written.
-- KEYS[1] rejected stream   KEYS[2] inbox stream
-- ARGV[1] inbox consumer group
-- ARGV[2..] one record per entry: inbox entry id, reason,
--   n (number of field/value pairs), field, value, ... (2n values)
-- returns: number of entries rejected
local group = ARGV[1]
local ids = {}
local i = 2
while i <= #ARGV do
  local entry, reason, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local args = { 'XADD', KEYS[1], '*', 'delayq-reason', reason, 'delayq-inbox-id', entry }
  for j = i + 3, i + 2 + 2 * n do args[#args + 1] = ARGV[j] end
  redis.call(unpack(args))
  ids[#ids + 1] = entry
  i = i + 3 + 2 * n
end
if #ids > 0 then
  redis.call('XACK', KEYS[2], group, unpack(ids))
  redis.call('XDEL', KEYS[2], unpack(ids))
end
return #ids
