-- 15-inbox.lua: how acknowledged inbox entries leave the inbox. Gives inbox_entries:
-- inbox_entries.KEPT and inbox_entries.forget (in one table: a script's chunk may hold
-- at most 200 locals at once, prelude included).
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
--   - acknowledged: gone already, or to go now.
-- So the entries below the first that is pending in either group go at once.

local inbox_entries = {
  -- The suffix of the group's kept group: group .. KEPT.
  KEPT = ':kept',
}

-- Removes from the inbox the entries acks names (acknowledged in the group already),
-- and every other acknowledged entry below the first entry still wanted. While an
-- entry is pending in the group, the acknowledged ones above it stay until a later
-- call's trim passes them (each call that acknowledges entries trims); while one is
-- kept, the trim stops below it and the call's own entries are deleted one by one.
-- Without the group (the inbox deleted and made again), they are deleted one by one.
function inbox_entries.forget(inbox, group, acks)
  if #acks == 0 then return end
  local groups = redis.pcall('XINFO', 'GROUPS', inbox)
  local last, held, kept
  if type(groups) == 'table' and not groups.err then
    local kept_name = group .. inbox_entries.KEPT
    for _, g in ipairs(groups) do
      local name, pending, delivered
      for f = 1, #g, 2 do
        local field = g[f]
        if field == 'name' then
          name = g[f + 1]
        elseif field == 'pending' then
          pending = g[f + 1]
        elseif field == 'last-delivered-id' then
          delivered = g[f + 1]
        end
      end
      if name == group then
        last, held = delivered, pending
      elseif name == kept_name and pending > 0 then
        kept = redis.call('XPENDING', inbox, kept_name, '-', '+', 1)[1][1]
      end
    end
  end
  if not last then
    chunked({ 'XDEL', inbox }, acks)
    return
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
