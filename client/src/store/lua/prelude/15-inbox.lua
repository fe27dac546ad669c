-- 15-inbox.lua: how acknowledged inbox entries leave the inbox, and how a marked read
-- ends. Gives inbox_entries: inbox_entries.KEPT, inbox_entries.groups,
-- inbox_entries.forget, inbox_entries.settle and inbox_entries.release (in one table: a script's chunk may
-- hold at most 200 locals at once, prelude included).
--
-- An entry leaves the inbox once acknowledged (its message stored, or its rejection
-- written). Deleted one at a time (XDEL) an entry costs Redis about a microsecond;
-- trimmed together (XTRIM MINID), the entries below an id cost next to nothing. The
-- group (made at id 0) hands entries out in order, so every entry up to its last
-- delivered id was handed out, and each is one of:
--   - pending in the group: read by some instance, not yet stored or rejected;
--   - pending in the kept group (group .. inbox_entries.KEPT): rejected without
--     being read (too large to read), and left in the inbox where its fields can
--     still be read;
--   - acknowledged: gone already, or to go now;
--   - in a marked read (lua/inbox_take.lua): handed out between its first and last
--     entry, which are pending in the group until the read ends.
-- So the entries below the first that is pending in either group go at once.
--
-- A marked read ends one of two ways. Stored whole by one schedule call, it is
-- settled: its consumer (node .. '@' .. F .. '..' .. L) is deleted, and its two pending
-- entries with it. Otherwise (an entry rejected, a call that failed, its reader gone)
-- it is released: every entry from F to L becomes pending one by one, and from there
-- each goes as an entry read on its own does.

local inbox_entries = {
  -- The suffix of the group's kept group: group .. KEPT.
  KEPT = ':kept',
}

-- The inbox's consumer groups by name, each its XINFO GROUPS fields by name
-- ('pending', 'last-delivered-id', 'entries-read', ...); none when the inbox is no
-- stream.
function inbox_entries.groups(inbox)
  local reply, groups = redis.pcall('XINFO', 'GROUPS', inbox), {}
  if type(reply) ~= 'table' or reply.err then return groups end
  for _, g in ipairs(reply) do
    local fields = {}
    for f = 1, #g, 2 do fields[g[f]] = g[f + 1] end
    groups[fields.name] = fields
  end
  return groups
end

-- Makes `ids` pending for consumer `to`, handed out `count` times (XCLAIM ... FORCE,
-- which makes an entry pending that was not).
function inbox_entries.claim(inbox, group, to, ids, count)
  for first = 1, #ids, CHUNK do
    local args = { 'XCLAIM', inbox, group, to, 0 }
    for i = first, math.min(first + CHUNK - 1, #ids) do args[#args + 1] = ids[i] end
    args[#args + 1] = 'RETRYCOUNT'
    args[#args + 1] = count
    args[#args + 1] = 'FORCE'
    args[#args + 1] = 'JUSTID'
    redis.call(unpack(args))
  end
end

-- The first and last entry of the marked read whose consumer is `read` (see
-- lua/inbox_take.lua), or nil when `read` is no read's consumer.
function inbox_entries.range(read)
  return string.match(read, '@(%d+%-%d+)%.%.(%d+%-%d+)$')
end

-- Ends the marked read `read`, stored whole by this call: its entries in `far` (too far
-- ahead to store) become pending one by one for its node, to be rejected, and its
-- consumer goes with its two pending entries. A read released meanwhile (its reader
-- too slow) has no consumer left: nothing to do but the far entries, which come twice
-- then (rejected twice at worst, never lost). Without the group nothing is pending.
function inbox_entries.settle(inbox, group, read, far)
  local gone = redis.pcall('XGROUP', 'DELCONSUMER', inbox, group, read)
  if type(gone) == 'table' and gone.err then return end
  if #far > 0 then inbox_entries.claim(inbox, group, string.match(read, '^(.*)@'), far, 1) end
end

-- Releases the marked read `read` if its pending entries have been idle `min_idle` ms:
-- every entry of its range becomes pending for consumer `to`, handed out once more than
-- its ends were plus `added`, and the read's consumer goes. Returns the entries, in
-- order, as XRANGE does (none when the read was settled or released already, or is
-- younger).
function inbox_entries.release(inbox, group, read, to, added, min_idle)
  local ends = redis.call('XPENDING', inbox, group, 'IDLE', min_idle, '-', '+', 100, read)
  if #ends == 0 then return {} end
  local first, last = inbox_entries.range(read)
  if not first then return {} end
  local count = 0
  for _, e in ipairs(ends) do count = math.max(count, e[4]) end
  local entries, ids = redis.call('XRANGE', inbox, first, last), {}
  for i, e in ipairs(entries) do ids[i] = e[1] end
  inbox_entries.claim(inbox, group, to, ids, count + added)
  redis.call('XGROUP', 'DELCONSUMER', inbox, group, read)
  return entries
end

-- Removes from the inbox the entries acks names (acknowledged in the group already),
-- and every other acknowledged entry below the first entry still wanted. While an
-- entry is pending in the group, the acknowledged ones above it stay until a later
-- call's trim passes them (each call that acknowledges entries trims); while one is
-- kept, the trim stops below it and the call's own entries are deleted one by one.
-- Without the group (the inbox deleted and made again), they are deleted one by one.
function inbox_entries.forget(inbox, group, acks)
  if #acks == 0 then return end
  local groups = inbox_entries.groups(inbox)
  local mine, kept_group = groups[group], groups[group .. inbox_entries.KEPT]
  if not mine then
    chunked({ 'XDEL', inbox }, acks)
    return
  end
  local last, held, kept = mine['last-delivered-id'], mine.pending, nil
  if kept_group and kept_group.pending > 0 then
    kept = redis.call('XPENDING', inbox, group .. inbox_entries.KEPT, '-', '+', 1)[1][1]
  end
  local below = kept or last
  -- The first entry pending in the group below that (none to ask for when the group
  -- holds nothing pending: a drained inbox's every call).
  local first = held > 0 and redis.call('XPENDING', inbox, group, '-', below, 1)[1]
  if first then below = first[1] end
  redis.call('XTRIM', inbox, 'MINID', below)
  if kept then
    chunked({ 'XDEL', inbox }, acks)
  elseif not first then
    -- The last delivered entry is acknowledged too: nothing is left to trim later.
    redis.call('XDEL', inbox, last)
  end
end
