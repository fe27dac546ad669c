-- reject_inbox.lua: move inbox entries that cannot be scheduled to the rejected stream,
-- each with its reason and original fields, and acknowledge (and delete) them, in one
-- atomic call: an entry leaves the inbox exactly when its rejection is written (one
-- never read stays in the stream, acknowledged, so its fields are not lost).
-- KEYS[1] rejected stream   KEYS[2] inbox stream
-- ARGV[1] inbox consumer group
-- ARGV[2..] one record per entry: inbox entry id, reason,
--   n (number of field/value pairs), field, value, ... (2n values);
--   n = -1: the entry was never read (no fields follow): it is acknowledged but kept
-- returns: number of entries rejected | error "WRONGTYPE ..." (nothing was changed)
-- All or nothing: both keys are checked before the first write, and an entry with more
-- fields than one XADD can carry is rejected with its id and reason only (its reason
-- says so), so no XADD after the first can fail.
for _, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'stream' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a stream')
  end
end

local group = ARGV[1]
local ids, deleted = {}, {}
local i = 2
while i <= #ARGV do
  local entry, reason, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local args = { 'XADD', KEYS[1], '*', 'delayq-reason', reason, 'delayq-inbox-id', entry }
  if n < 0 then
    n = 0
  else
    deleted[#deleted + 1] = entry
  end
  if 2 * n > MAX_FIELD_VALUES then
    args[5] = reason .. ' (its ' .. n .. ' fields are too many to copy)'
  else
    for j = i + 3, i + 2 + 2 * n do args[#args + 1] = ARGV[j] end
  end
  redis.call(unpack(args))
  ids[#ids + 1] = entry
  i = i + 3 + 2 * n
end
chunked({ 'XACK', KEYS[2], group }, ids)
chunked({ 'XDEL', KEYS[2] }, deleted)
return #ids
