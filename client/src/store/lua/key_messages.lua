-- key_messages.lua: one shard's messages of a business key in one stream. Read-only.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records
-- ARGV[1] stream   ARGV[2] key
-- returns: { id, state, ms, detail, ... }, four values per message, oldest listed first:
--   scheduled | held: ms is its due time, detail its priority
--   delivered | expired | dead | cancelled: ms is when, detail the stream entry written
--   ("" if none)
-- Ids the index still lists but that are neither pending with this key nor on record
-- are left out (trim drops them from the index).
local stream, key = ARGV[1], ARGV[2]
local X = key_index_of(KEYS[2], stream)
local P = pending_of(KEYS[1], KEYS[2])
local out = {}
for _, id in ipairs(key_ids(X, key)) do
  local state = key_message_state(P, KEYS[3], key, stream, id)
  if state then
    out[#out + 1] = id
    out[#out + 1] = state[1]
    out[#out + 1] = state[2]
    out[#out + 1] = tostring(state[3])
  end
end
return out
