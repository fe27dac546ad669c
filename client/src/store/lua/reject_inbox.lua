-- reject_inbox.lua: move inbox entries that cannot be scheduled to the rejected stream,
-- each with its reason and original fields, and acknowledge (and delete) them, in one
-- atomic call: an entry leaves the inbox exactly when its rejection is written (one
-- never read stays in the stream, acknowledged and pending in the kept group, so its
-- fields are not lost; see inbox_entries.forget).
-- KEYS[1] rejected stream   KEYS[2] inbox stream
-- ARGV[1] inbox consumer group
-- ARGV[2..] one record per entry: inbox entry id, reason,
--   n (number of field/value pairs), field, value, ... (2n values);
--   n = -1: the entry was never read (no fields follow): it is acknowledged but kept
--   (pending in group .. inbox_entries.KEPT, under consumer "delayq")
-- returns: number of entries rejected | error "WRONGTYPE ...", "ERR ... exhausted ..."
--   (the rejected stream has too few ids left) or an XADD's error (nothing was changed)
-- All or nothing: both keys are checked before the first write, and an entry with more
-- fields than one XADD can carry is rejected with its id and reason only (its reason
-- says so). The one way an XADD with an id of Redis's choosing fails on a stream is
-- the stream running out of ids (its last id near the largest there is, as an XADD
-- or XSETID with an explicit id can leave it): a call whose rejections do not all fit
-- is refused before the first write. Should an XADD fail all the same, the rejections
-- written before it are deleted again and its error returned, so that no entry is
-- rejected twice once it is tried again.
for _, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'stream' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. key .. ' is a ' .. kind .. ', not a stream')
  end
end

-- How many more entries the rejected stream takes (nil: more than any call brings).
-- Only a last id with the largest ms leaves fewer than a million; its seq, up to 20
-- digits, is compared by its last 6 (a Lua number is a double).
local function ids_left(key)
  local info = redis.pcall('XINFO', 'STREAM', key)
  if type(info) ~= 'table' or info.err then return nil end
  local last
  for k = 1, #info, 2 do
    if info[k] == 'last-generated-id' then last = info[k + 1] end
  end
  local ms, seq = string.match(last or '', '^(%d+)%-(%d+)$')
  if ms ~= '18446744073709551615' or #seq < 20 or string.sub(seq, 1, 14) ~= '18446744073709' then
    return nil
  end
  return 551615 - tonumber(string.sub(seq, 15))
end

-- Where each entry's record starts in ARGV.
local starts, k = {}, 2
while k <= #ARGV do
  starts[#starts + 1] = k
  k = k + 3 + 2 * math.max(tonumber(ARGV[k + 2]), 0)
end
local left = ids_left(KEYS[1])
if left and left < #starts then
  return redis.error_reply('ERR ' .. KEYS[1] .. ' has ids left for ' .. left .. ' more entries, not '
    .. #starts .. ': the stream has exhausted the last possible ID')
end

local group = ARGV[1]
local ids, deleted, kept, rejections = {}, {}, {}, {}
for _, i in ipairs(starts) do
  local entry, reason, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local args = { 'XADD', KEYS[1], '*', 'delayq-reason', reason, 'delayq-inbox-id', entry }
  if n < 0 then
    n = 0
    kept[#kept + 1] = entry
  else
    deleted[#deleted + 1] = entry
  end
  if 2 * n > MAX_FIELD_VALUES then
    args[5] = reason .. ' (its ' .. n .. ' fields are too many to copy)'
  else
    for j = i + 3, i + 2 + 2 * n do args[#args + 1] = ARGV[j] end
  end
  local written = redis.pcall(unpack(args))
  if type(written) == 'table' and written.err then
    chunked({ 'XDEL', KEYS[1] }, rejections)
    return redis.error_reply(written.err)
  end
  rejections[#rejections + 1] = written
  ids[#ids + 1] = entry
end
chunked({ 'XACK', KEYS[2], group }, ids)
-- An entry never read stays in the inbox, pending in the kept group, so that no trim
-- takes it (see inbox_entries.forget); an operator lets it go with XACK.
if #kept > 0 then
  local kept_group = group .. inbox_entries.KEPT
  redis.pcall('XGROUP', 'CREATE', KEYS[2], kept_group, '$')
  for _, entry in ipairs(kept) do
    redis.call('XCLAIM', KEYS[2], kept_group, 'delayq', 0, entry, 'FORCE', 'JUSTID')
  end
end
inbox_entries.forget(KEYS[2], group, deleted)
return #ids
