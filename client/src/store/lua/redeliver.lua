-- redeliver.lua: a stream entry that a consumer group left unacknowledged past the
-- ack timeout goes back into delayq (same id and fields, next attempt, due after a
-- backoff), or after the last attempt to the dead-letter stream; the stale entry is
-- acknowledged in the same call, so a crash can neither lose nor double a redelivery,
-- and calling again for the same entry finds it no longer pending and does nothing.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records   KEYS[4] records by expiry   KEYS[5] fence
-- KEYS[6] held streams (all of the message's shard)
-- ARGV[1] epoch of the leader calling
-- ARGV[2] stream   ARGV[3] consumer group   ARGV[4] entry id
-- ARGV[5] message id, as the caller read it from the entry (it chose KEYS by it)
-- ARGV[6] ack timeout ms: the entry must still have been idle this long
-- ARGV[7] max attempts
-- ARGV[8] first backoff ms   ARGV[9] backoff cap ms   ARGV[10] jitter fraction 0..1
-- ARGV[11] a random number in [0, 1), for the jitter
-- ARGV[12] dead-letter stream
-- ARGV[13] id field   ARGV[14] attempt field (names delayq appends to every entry)
-- ARGV[15] the records policy: how long to keep the dead-letter record, and how
-- ARGV[16] wake-up channel
-- ARGV[17] the pending layout to store the next attempt in: "compact" | "hash"
-- ARGV[18] "apart" when the stream is kept apart (streams.max_rate): the next attempt
--          goes to its held set instead (see Held in the prelude)
-- ARGV[19] key field (forwarder.key_field, "" = none): the next attempt keeps the
--          business key the entry carries there
-- returns: { "rescheduled", attempt, due_ms }      the next attempt is scheduled
--        | { "dead", attempts, dead_entry_id }     written to the dead-letter stream
--        | { "fresh" }       no longer pending that long (acknowledged, or claimed again)
--        | { "superseded" }  the message is scheduled again or was delivered since;
--                            only the stale entry is acknowledged
--        | { "gone" }        pending, but deleted from the stream; acknowledged
--        | { "foreign" }     not an entry delayq wrote for this id (or more fields than
--                            delayq writes), or one that another deployment sharing
--                            the stream wrote (no record of it here, younger than the
--                            retention); left alone
--        | { "nogroup" }     the stream or the group does not exist
--        | error "FENCED ..." | error "DEADLETTER ..." (nothing was changed)
-- Dead-letter entries: the producer's fields, then the id and attempt fields,
-- delayq-reason (max_attempts), delayq-first-delivery and delayq-last-delivery (ms),
-- delayq-group and delayq-consumer.
-- The stream lies outside the shard's hash tag: this script needs standalone Redis
-- (or Sentinel), like forward.lua; on Redis Cluster it would be refused (CROSSSLOT).
local held = fenced(KEYS[5], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local stream, group, entry, id = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local id_field, attempt_field = ARGV[13], ARGV[14]

local pending = redis.pcall('XPENDING', stream, group, 'IDLE', tonumber(ARGV[6]), entry, entry, 1)
if type(pending) == 'table' and pending.err then
  if string.find(pending.err, 'NOGROUP', 1, true) then return { 'nogroup' } end
  return redis.error_reply(pending.err)
end
if #pending == 0 then return { 'fresh' } end
local consumer, idle = pending[1][2], pending[1][3]

local read = redis.call('XRANGE', stream, entry, entry)
if #read == 0 then
  redis.call('XACK', stream, group, entry)
  return { 'gone' }
end
local key_field = ARGV[19] or ''
local own = {}
own[id_field] = true
own[attempt_field] = true
if key_field ~= '' then own[key_field] = true end
local fields, extra = split_own_fields(read[1][2], own)
-- More fields than delayq ever writes (see MAX_FIELD_VALUES): not delayq's entry.
if extra[id_field] ~= id or #fields == 0 or #fields > MAX_FIELD_VALUES then return { 'foreign' } end

-- The record of the latest delivery, if this entry is it, knows the attempt and the
-- first delivery; another record means a newer outcome of the same message.
local last_delivered = tonumber(string.match(entry, '^(%d+)'))
local attempt = tonumber(extra[attempt_field]) or 1
local first_delivered = last_delivered
local priority, expire_at = 0, 0
local P = pending_of(KEYS[1], KEYS[2])
if pending_find(P, id) then
  redis.call('XACK', stream, group, entry)
  return { 'superseded' }
end
local rec = find_record(KEYS[3], id)
if rec then
  if rec.entry ~= entry then
    redis.call('XACK', stream, group, entry)
    return { 'superseded' }
  end
  attempt = tonumber(rec.attempt) or attempt
  first_delivered = tonumber(rec.first_delivered) or first_delivered
  priority = tonumber(rec.priority) or 0
  expire_at = tonumber(rec.expire_at) or 0
end
local now = now_ms()
-- No record of the entry: one this deployment delivered keeps its record at least the
-- retention after it reached the stream, so an entry younger than that was written by
-- another deployment sharing the stream (another prefix), which redelivers its own.
if not rec and last_delivered and now - last_delivered < (records_policy(ARGV[15]) or 0) then
  return { 'foreign' }
end
if attempt >= tonumber(ARGV[7]) then
  local args = { 'XADD', ARGV[12], '*' }
  for i = 1, #fields do args[#args + 1] = fields[i] end
  for _, pair in ipairs({
    { id_field, id }, { attempt_field, attempt }, { 'delayq-reason', 'max_attempts' },
    { 'delayq-first-delivery', first_delivered }, { 'delayq-last-delivery', last_delivered },
    { 'delayq-group', group }, { 'delayq-consumer', consumer },
  }) do
    args[#args + 1] = pair[1]; args[#args + 1] = pair[2]
  end
  -- Written first, through pcall: if it fails, nothing has changed yet.
  local dead = redis.pcall(unpack(args))
  if type(dead) == 'table' and dead.err then
    return redis.error_reply('DEADLETTER cannot write to ' .. ARGV[12] .. ': ' .. dead.err)
  end
  redis.call('XACK', stream, group, entry)
  -- The delivery record goes first: it may sit in another generation or layout.
  forget_record(KEYS[3], KEYS[4], id)
  local rec = record('dead', dead, now, attempt, ARGV[12], first_delivered)
  rec.why = 'max_attempts'
  keep_record(KEYS[3], KEYS[4], id, rec, now, ARGV[15], stream)
  return { 'dead', attempt, dead }
end

local delay = math.min(tonumber(ARGV[8]) * 2 ^ (attempt - 1), tonumber(ARGV[9]))
delay = math.floor(delay * (1 - tonumber(ARGV[10]) * tonumber(ARGV[11])))
local due = now + delay
local why = 'ack_timeout: entry ' .. entry .. ' pending ' .. idle .. ' ms with consumer ' .. consumer .. ' in group ' .. group
-- Priority and the expiry time (due + ttl) come from the delivery record; a redelivery
-- due past its expiry is dead-lettered as expired by the forward, like any message.
-- The creation time is the redelivery's.
local msg = { stream = stream, fields = fields, due = due, priority = priority, created = now,
  attempt = attempt + 1, expire_at = expire_at, first_delivered = first_delivered, reason = why }
if key_field ~= '' then msg.key = extra[key_field] end
local score = score_of(due, priority)
local wake = pending_add_one(P, KEYS[6], ARGV[17], ARGV[18] == 'apart', id, score, msg)
forget_record(KEYS[3], KEYS[4], id)
redis.call('XACK', stream, group, entry)
if select(3, records_policy(ARGV[15])) then
  -- A step of the message's transition log: the entry no consumer acknowledged.
  local line = journal_line('A', id, now, entry, stream) .. ' ' .. (attempt + 1)
  redis.call('RPUSH', journal_outbox(KEYS[3]), journal_item(line))
end
if wake then redis.call('PUBLISH', ARGV[16], KEYS[1]) end
return { 'rescheduled', attempt + 1, due }
