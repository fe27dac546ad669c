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

local now = now_ms()
local due, too_far = resolve_due(ARGV[4], ARGV[5], ARGV[6], now)
if not due then return redis.error_reply(too_far) end

local fields = {}
for i = 11, #ARGV do fields[#fields + 1] = ARGV[i] end
local id = ARGV[2]
local new = { stream = ARGV[9], fields = fields, priority = tonumber(ARGV[7]), ttl = tonumber(ARGV[8]) }
local status, at, state = store_message({ KEYS[1], KEYS[2], KEYS[3], KEYS[4] }, id, ARGV[3] == 'replace',
  due, new, now)
if status == 'duplicate' then return { status, at, state } end

local first = redis.call('ZRANGE', KEYS[1], 0, 0)
if first[1] == id then redis.call('PUBLISH', ARGV[10], KEYS[1]) end
return { status, at }
