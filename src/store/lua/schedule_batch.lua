-- schedule_batch.lua: store messages of one shard, idempotently by id, and acknowledge
-- the inbox entries they came from, in one atomic call: an inbox entry is acknowledged
-- (and deleted from the inbox) exactly when its message is stored. Every message is
-- stored through here: a single push is a batch of one.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records   KEYS[4] records by expiry   KEYS[5] fence
-- KEYS[6] held streams (a held message replaced here leaves its held set)
-- ARGV[1] epoch (0 for producers)
-- ARGV[2] max delay ms: a due time further than this from now is refused, per message
-- ARGV[3] wake-up channel, published to with the shard's due set when its earliest due time moves earlier
-- ARGV[4] inbox stream ("" = no entries to acknowledge)
-- ARGV[5] inbox consumer group
-- ARGV[6] the pending layout to store messages in: "compact" | "hash" (see the prelude)
-- ARGV[7..] one record per message, in order:
--   inbox entry id ("" = none), mode ("new" | "replace"), then the message as the
--   prelude's read_new_message reads it: id, due kind ("in": the due value is a delay in
--   ms; "at": epoch ms), due value, priority 0-9, ttl ms (0 = none), target stream,
--   n (number of field/value pairs), field, value, ... (2n values)
-- returns: { status, due_ms, detail, ... }, three values per message, in order:
--   "scheduled" | "replaced", due_ms, ""
--   | "duplicate", due_ms (0 if no longer scheduled), state
--   | "too_far", 0, text: nothing stored and the inbox entry NOT acknowledged
--   | error "FENCED ..."
-- The inbox stream is named in ARGV, not KEYS, like forward.lua's target streams: it
-- lives outside the shard's hash tag.
local held = fenced(KEYS[5], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local now = now_ms()
local keys = { KEYS[1], KEYS[2], KEYS[3], KEYS[4] }
local max_delay, inbox, group, layout = ARGV[2], ARGV[4], ARGV[5], ARGV[6]
local P = pending_of(KEYS[1], KEYS[2])
local before = pending_first(P)
-- Every check comes before the first write (below the loop), so the call is all or nothing.
if inbox ~= '' then
  local kind = redis.call('TYPE', inbox)['ok']
  if kind ~= 'stream' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE inbox ' .. inbox .. ' is a ' .. kind .. ', not a stream')
  end
end

-- Bodies and scores are written once for the whole call, so messages stored earlier in
-- this call are tracked here, in arrays by slot (order[k] is the id in slot k): a
-- repeated id is a duplicate of its earlier self, or replaces it.
local out, n_out, acks = {}, 0, {}
local slot, order, slot_due, slot_score, slot_msg, in_way, unholds, replaced = {}, {}, {}, {}, {}, {}, {}, {}
local i = 7
while i <= #ARGV do
  local entry, replace = ARGV[i], ARGV[i + 1] == 'replace'
  local id, due_kind, due_value, ttl, msg
  id, due_kind, due_value, ttl, msg, i = read_new_message(ARGV, i + 2)

  local due, too_far = resolve_due(due_kind, due_value, max_delay, now)
  local k = slot[id]
  local status, at, state
  if not due then
    status, at, state = 'too_far', 0, too_far
  elseif k and not replace then
    status, at, state = 'duplicate', slot_due[k], 'scheduled'
  else
    if k then
      status = 'replaced'
    else
      local record_in_way, held_in, where
      status, at, state, record_in_way, held_in, where = admit(keys, id, replace)
      if record_in_way then in_way[#in_way + 1] = id end
      if held_in then unholds[#unholds + 1] = { held_in, id } end
      if where then replaced[#replaced + 1] = { id, where } end
    end
    if status ~= 'duplicate' then
      if not k then
        k = #order + 1
        order[k], slot[id] = id, k
      end
      slot_due[k], slot_score[k], slot_msg[k] = due, score_of(due, msg.priority), new_msg(msg, ttl, due, now)
      at, state = due, ''
    end
  end
  out[n_out + 1], out[n_out + 2], out[n_out + 3] = status, at, state
  n_out = n_out + 3
  if status ~= 'too_far' and entry ~= '' then acks[#acks + 1] = entry end
end

-- Records and messages in the way (see admit).
for _, id in ipairs(in_way) do forget_record(KEYS[3], KEYS[4], id) end
for _, r in ipairs(replaced) do pending_remove(P, r[1], r[2]) end
for _, h in ipairs(unholds) do unhold(KEYS[6], h[1], h[2]) end
pending_add(P, layout, order, slot_score, slot_msg)

if inbox ~= '' then
  chunked({ 'XACK', inbox, group }, acks)
  chunked({ 'XDEL', inbox }, acks)
end

local after = pending_first(P)
if after and (not before or after < before) then
  redis.call('PUBLISH', ARGV[3], KEYS[1])
end
return out
