-- cancel.lua: withdraw a scheduled message; the answer is always definite.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records   KEYS[4] records by expiry   KEYS[5] fence
-- KEYS[6] held streams (a message held back by its stream's rate limit is scheduled too)
-- ARGV[1] epoch (0 for producers)
-- ARGV[2] id
-- ARGV[3] the records policy: how long to keep the cancellation on record, and how
-- returns: "cancelled <now ms> <stream>" (cancelled now, at Redis's time; the stream is
--   empty where the body could not be read) | "already_cancelled" |
--   "delivered" | "expired" | "dead" | "unknown"
local held = fenced(KEYS[5], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local id = ARGV[2]
local P = pending_of(KEYS[1], KEYS[2])
local where = pending_find(P, id)
-- A body alone is a held message's, if its stream's held set has it.
if where and (where.score or unhold_message(KEYS[2], KEYS[6], id)) then
  pending_remove(P, id, where)
  local now = now_ms()
  local stream = where.body and body_stream(where.body) or ''
  keep_record(KEYS[3], KEYS[4], id, record('cancelled', '', now, 0, stream), now, ARGV[3], stream)
  return 'cancelled ' .. now .. ' ' .. stream
end
local rec = find_record(KEYS[3], id)
if rec then
  if rec.state == 'cancelled' then return 'already_cancelled' end
  return rec.state
end
return 'unknown'
