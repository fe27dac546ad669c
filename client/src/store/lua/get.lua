-- get.lua: a message's state and details. Read-only.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records
-- ARGV[1] id
-- returns: { "scheduled", { stream, { field, value, ... }, due_ms, priority, created_ms, attempt,
--                            expire_at_ms, first_delivered_ms, redelivery_reason } }
--            (the prelude's body_values: the body schema's fields in order, nil where not set)
--        | { "corrupt", reason }
--        | { state, stream, entry_id, at_ms, attempt, late_ms }  for delivered, expired, dead,
--          cancelled (late_ms: how long after its due time a delivered message was sent, ""
--          when not at all or not on record)
--        | { "unknown" }
local id = ARGV[1]
local where = pending_find(pending_of(KEYS[1], KEYS[2]), id)
local body = where and where.body
if body then
  local msg, why = decode_body(body, where.score)
  if not msg then return { 'corrupt', why } end
  return { 'scheduled', body_values(msg) }
end
local rec = find_record(KEYS[3], id)
if rec then return { rec.state, rec.stream, rec.entry, tonumber(rec.at), tonumber(rec.attempt), rec.late } end
return { 'unknown' }
