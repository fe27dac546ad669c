-- reschedule.lua: move a scheduled message to a new due time; priority, fields and ttl stay.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records   KEYS[4] fence   KEYS[5] held streams
-- ARGV[1] epoch (0 for producers)
-- ARGV[2] id
-- ARGV[3] due kind: "in" (ARGV[4] is a delay in ms) or "at" (ARGV[4] is epoch ms)
-- ARGV[4] due value
-- ARGV[5] max delay ms
-- ARGV[6] wake-up channel
-- ARGV[7] the pending layout to store it in: "compact" | "hash" (see the prelude)
-- ARGV[8] "j" while the journal is on: the new due time goes to the journal's outbox
-- ARGV[9..] streams kept apart (streams.max_rate): a message to one goes back to its
--   held set at its new time, not into the pending layout (see Held in the prelude)
-- returns: { "rescheduled", due_ms, now ms (Redis's time of the change), stream }
--        | { state } for a message no longer scheduled
--        (delivered, expired, dead, cancelled) | { "unknown" }
--        | error "TOO_FAR ..." | error "CORRUPT ..." | error "FENCED ..."
local held = fenced(KEYS[4], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local id = ARGV[2]
local P = pending_of(KEYS[1], KEYS[2])
local where = pending_find(P, id)
local body = where and where.body
if not body then
  local rec = find_record(KEYS[3], id)
  if rec then return { rec.state } end
  return { 'unknown' }
end
local msg, why = decode_body(body, where.score)
if not msg then return redis.error_reply('CORRUPT message ' .. id .. ': ' .. why) end

local now = now_ms()
local due, too_far = resolve_due(ARGV[3], ARGV[4], ARGV[5], now)
if not due then return redis.error_reply(too_far) end

-- A ttl counts from the due time, so it moves with it.
if msg.expire_at > 0 then msg.expire_at = due + (msg.expire_at - msg.due) end
msg.due = due
pending_remove(P, id, where)
unhold(KEYS[5], msg.stream, id) -- a held message is scheduled again, at its new time
local apart = false
for a = 9, #ARGV do apart = apart or ARGV[a] == msg.stream end
local score = score_of(due, msg.priority)
if pending_add_one(P, KEYS[5], ARGV[7], apart, id, score, msg) then
  redis.call('PUBLISH', ARGV[6], KEYS[1])
end
if ARGV[8] == 'j' then
  redis.call('RPUSH', journal_outbox(KEYS[3]), journal_item(journal_line('R', id, now, tostring(due), msg.stream)))
end
return { 'rescheduled', due, now, msg.stream }
