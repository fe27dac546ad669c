-- replay_dead.lua: schedule a dead letter again, due now, and remove it from the
-- dead-letter stream in the same call, so it is either back in delayq or still a
-- dead letter, never both and never neither.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records   KEYS[4] records by expiry   KEYS[5] fence
-- KEYS[6] held streams (all of the message's shard)
-- ARGV[1] epoch (0: an operator's request, accepted by any instance)
-- ARGV[2] dead-letter stream   ARGV[3] its entry id
-- ARGV[4] message id, as the caller read it from the entry (it chose KEYS by it)
-- ARGV[5] target stream   ARGV[6] id field   ARGV[7] wake-up channel
-- ARGV[8] the pending layout to store it in: "compact" | "hash" (see the prelude)
-- ARGV[9] "apart" when the target stream is kept apart (streams.max_rate): the message
--         goes to its held set instead (see Held in the prelude)
-- ARGV[10] "j" while the journal is on: the replay goes to the journal's outbox
-- ARGV[11] the field that carries a message's business key on its entries
--          (forwarder.key_field, "" = none): the replayed message keeps its key
-- ARGV[12..] names of the fields delayq appends to entries (the id field among them);
--           trailing fields with these names are not the producer's and are dropped
-- returns: { "replayed", due_ms }  scheduled as attempt 1, the dead letter deleted
--        | { "scheduled" }  the id is scheduled already; the dead letter stays
--        | { "gone" }       no such entry (replayed or purged meanwhile)
--        | { "foreign" }    the entry does not carry this id, or more fields than delayq
--                           writes; left alone
--        | error "FENCED ..."
-- The dead-letter stream lies outside the shard's hash tag: standalone Redis (or
-- Sentinel) only, like forward.lua.
local held = fenced(KEYS[5], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local dead_stream, entry, id = ARGV[2], ARGV[3], ARGV[4]
local read = redis.call('XRANGE', dead_stream, entry, entry)
if #read == 0 then return { 'gone' } end
local key_name = ARGV[11]
local own = {}
for i = 12, #ARGV do own[ARGV[i]] = true end
if key_name ~= '' then own[key_name] = true end
local fields, extra = split_own_fields(read[1][2], own)
if extra[ARGV[6]] ~= id or #fields == 0 or #fields > MAX_FIELD_VALUES then return { 'foreign' } end
local P = pending_of(KEYS[1], KEYS[2])
if pending_find(P, id) then return { 'scheduled' } end

-- A replay starts over: attempt 1, with the full allowance of attempts.
local now = now_ms()
local score = score_of(now, 0)
-- Its business key, as the entry carries it (one that breaks the key's rules is left).
local key = key_name ~= '' and extra[key_name] or nil
if key and (#key > 128 or not string.match(key, '^[%w%._:%-]+$')) then key = nil end
local msg = new_msg({ stream = ARGV[5], fields = fields, priority = 0, key = key }, 0, now, now)
local wake = pending_add_one(P, KEYS[6], ARGV[8], ARGV[9] == 'apart', id, score, msg)
if key then
  -- Listed under its key again unless it still is (trim may have pruned it).
  local X, listed = key_index_of(KEYS[2], ARGV[5]), false
  for _, other in ipairs(key_ids(X, key)) do
    if other == id then listed = true end
  end
  if not listed then key_add_to(X, { { key, id } }) end
end
forget_record(KEYS[3], KEYS[4], id)
redis.call('XDEL', dead_stream, entry)
if ARGV[10] == 'j' then
  redis.call('RPUSH', journal_outbox(KEYS[3]), journal_item(journal_line('P', id, now, tostring(now), ARGV[5])))
end
if wake then redis.call('PUBLISH', ARGV[7], KEYS[1]) end
return { 'replayed', now }
