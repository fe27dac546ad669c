-- get.lua: a message's state and details. Read-only.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records
-- ARGV[1] id
-- returns: { "scheduled", stream, due_ms, priority, created_ms, attempt, expire_at_ms, field, value, ... }
--        | { "corrupt", reason }
--        | { state, stream, entry_id, at_ms, attempt }  for delivered, expired, dead, cancelled
--        | { "unknown" }
local id = ARGV[1]
local body = redis.call('HGET', KEYS[2], id)
if body then
  local m, why = decode_body(body)
  if not m then return { 'corrupt', why } end
  local out = { 'scheduled', m[2], m[4], m[5], m[6], m[7], m[8] }
  for i = 1, #m[3] do out[#out + 1] = m[3][i] end
  return out
end
local rec = redis.call('HGET', KEYS[3], id)
if rec then
  local parts = {}
  for part in string.gmatch(rec .. '\n', '([^\n]*)\n') do parts[#parts + 1] = part end
  return { parts[1], parts[5] or '', parts[2], tonumber(parts[3]), tonumber(parts[4]) }
end
return { 'unknown' }
