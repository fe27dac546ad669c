-- schedule.lua: store a new message, idempotently by id.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records   KEYS[4] records by expiry   KEYS[5] fence
-- ARGV[1] epoch (0 for producers)
-- ARGV[2] id
-- ARGV[3] mode: "new" (an existing id is a duplicate) or "replace" (an existing id is overwritten)
-- ARGV[4] due kind: "in" (ARGV[5] is a delay in ms) or "at" (ARGV[5] is epoch ms)
-- ARGV[5] due value
-- ARGV[6] max delay ms: a due time further than this from now is refused
-- ARGV[7] priority 0-9
-- ARGV[8] ttl ms (0 = none)
-- ARGV[9] target stream
-- ARGV[10] wake-up channel, published to with the shard's due set when this message becomes its earliest
-- ARGV[11..] field, value, field, value, ...
-- returns: { "scheduled" | "replaced", due_ms }
--        | { "duplicate", due_ms (0 if no longer scheduled), state }
--        | error "TOO_FAR ..." | error "FENCED ..."
local held = fenced(KEYS[5], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local id = ARGV[2]
local replace = ARGV[3] == 'replace'
local now = now_ms()
local due = tonumber(ARGV[5])
if ARGV[4] == 'in' then due = now + due end
if due - now > tonumber(ARGV[6]) then
  return redis.error_reply('TOO_FAR due time ' .. due .. ' is more than max_delay ' .. ARGV[6] .. ' ms after now ' .. now)
end
if due < now then due = now end

local existing = redis.call('ZSCORE', KEYS[1], id)
if existing and not replace then
  return { 'duplicate', math.floor(tonumber(existing) / 10), 'scheduled' }
end
local replaced = existing ~= false
local rec = redis.call('HGET', KEYS[3], id)
if rec then
  -- A cancelled id may be pushed again; a delivered, expired or dead one only with replace.
  local state = record_state(rec)
  if state ~= 'cancelled' then
    if not replace then return { 'duplicate', 0, state } end
    replaced = true
  end
  forget_record(KEYS[3], KEYS[4], id)
end

local priority = tonumber(ARGV[7])
local ttl = tonumber(ARGV[8])
local expire_at = 0
if ttl > 0 then expire_at = due + ttl end
local fields = {}
for i = 11, #ARGV do fields[#fields + 1] = ARGV[i] end
local body = cmsgpack.pack({ 1, ARGV[9], fields, due, priority, now, 1, expire_at })

redis.call('HSET', KEYS[2], id, body)
redis.call('ZADD', KEYS[1], score_of(due, priority), id)
local first = redis.call('ZRANGE', KEYS[1], 0, 0)
if first[1] == id then redis.call('PUBLISH', ARGV[10], KEYS[1]) end

if replaced then return { 'replaced', due } end
return { 'scheduled', due }
