-- cancel_key.lua: withdraw every scheduled message of one shard that carries a
-- business key in one stream, atomically; the answer is always definite.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records   KEYS[4] records by expiry   KEYS[5] fence
-- KEYS[6] held streams (a message held back by its stream's rate limit is scheduled too)
-- ARGV[1] epoch (0 for producers)
-- ARGV[2] stream   ARGV[3] key
-- ARGV[4] the records policy: how long to keep the cancellations on record, and how
-- returns: { cancelled, delivered, now ms, id, id, ... }: how many messages were
--   cancelled (their ids follow, for the journal) and how many of the key's messages
--   on record were delivered already. A key with nothing pending cancels nothing:
--   calling again is harmless.
local held = fenced(KEYS[5], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local stream, key = ARGV[2], ARGV[3]
local X = key_index_of(KEYS[2], stream)
local P = pending_of(KEYS[1], KEYS[2])
local now = now_ms()
local ids, parts, delivered = {}, {}, 0
for _, id in ipairs(key_ids(X, key)) do
  local state, where = key_message_state(P, KEYS[3], key, stream, id)
  -- A body alone is a held message's, if its stream's held set has it (as in cancel.lua).
  if state and state[1] == 'held' and not unhold(KEYS[6], stream, id) then state = nil end
  if state and (state[1] == 'scheduled' or state[1] == 'held') then
    pending_remove(P, id, where)
    ids[#ids + 1] = id
    parts[#parts + 1] = record('cancelled', '', now, 0, stream)
  elseif state and state[1] == 'delivered' then
    delivered = delivered + 1
  end
end
if #ids > 0 then keep_records(KEYS[3], KEYS[4], ids, parts, now, ARGV[4]) end
local out = { #ids, delivered, now }
for i, id in ipairs(ids) do out[3 + i] = id end
return out
