-- 70-admit.lua: the idempotency rules of a push. Gives admit and new_msg.

-- Decides whether a message may be stored under id, by the idempotency rules: a
-- scheduled id, or one with a record other than a cancellation, is a duplicate unless
-- replace. Read-only: a record in the way is the caller's to forget when it writes, a
-- pending message it replaces the caller's to remove (pending_remove, then unhold).
-- keys: { due set, bodies, records, records by expiry }. indexed: what the caller
-- found in the index already (index_entry.enter): false for no entry, or the score
-- of id's entry; nil to look. rec: id's record (as find_record gives it, false for
-- none) if the caller has looked it up already; nil to look.
-- returns: "scheduled" | "replaced", nil, nil, record_in_way, held_stream, where (the
--          id may be stored; held_stream: the stream whose held set has it; where: the
--          pending message it replaces, as pending_find gives it)
--        | "duplicate", due (0 if no longer scheduled), state
local function admit(keys, id, replace, indexed, rec)
  local P = pending_of(keys[1], keys[2], keys[3])
  local existing, held_in = nil, nil
  -- A duplicate in the compact layout is answered from the index alone.
  if indexed == nil then indexed = index_entry.get(P, id) or false end
  if indexed and not replace then return 'duplicate', math.floor(indexed / 10), 'scheduled' end
  local where = pending_find(P, id, indexed)
  if where then
    existing = where.score
    if not existing then
      -- Held back by its stream's rate limit: scheduled, with only its body to show it.
      local msg = where.body and decode_body(where.body)
      existing = 0
      if msg then existing, held_in = score_of(msg.due, msg.priority), msg.stream end
    end
  end
  if existing and not replace then
    return 'duplicate', math.floor(tonumber(existing) / 10), 'scheduled'
  end
  local replaced = where ~= nil
  if rec == nil then rec = find_record(keys[3], id) or false end
  if rec then
    -- A cancelled id may be pushed again as new; a delivered, expired or dead one only with replace.
    if rec.state ~= 'cancelled' then
      if not replace then return 'duplicate', 0, rec.state end
      replaced = true
    end
  end
  local status = 'scheduled'
  if replaced then status = 'replaced' end
  return status, nil, nil, rec ~= false, held_in, where
end

-- A new message: msg (as read_new_message gives it) due at due, attempt 1, created
-- now; a ttl (ms, 0 = none) counts from the due time.
local function new_msg(msg, ttl, due, now)
  local expire_at = 0
  if ttl > 0 then expire_at = due + ttl end
  msg.due, msg.created, msg.attempt, msg.expire_at = due, now, 1, expire_at
  return msg
end
