-- forward.lua: move up to a batch of due messages from one shard into their streams,
-- atomically, so a crash can neither lose nor duplicate a forward.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records   KEYS[4] records by expiry   KEYS[5] fence
-- KEYS[6] held streams (see the prelude)
-- KEYS[7] the streams an operator paused: a paused stream's budget is 0 whatever ARGV
--   says, so that a pause is in force from the moment Redis took it. On Redis Cluster,
--   the slot's own copy of that set (the set itself lies in another slot). The
--   caller's budgets of 0 carry a pause too, from its next read of the set.
-- ARGV[1] epoch of the leader calling
-- ARGV[2] batch size
-- ARGV[3] the records policy: how long to keep delivery records (ms), and how (see
--   records_policy in the prelude)
-- ARGV[4] name of the id field added to each entry ("" = none)
-- ARGV[5] name of the attempt field added to each entry ("" = none)
-- ARGV[6] suffix of a stream's dead-letter stream (e.g. ":dead")
-- ARGV[7] stream for messages that cannot be read or written at all
-- ARGV[8] default MAXLEN ~ for target streams (0 = none)
-- ARGV[9] "cluster" when the shard is a Redis Cluster hash slot: a dead-letter stream
--   is then named in its stream's slot (see dead_letter_stream below), else ""
-- ARGV[10] name of the field that carries a message's business key ("" = none; a
--   message without a key gets none)
-- ARGV[11] L, the number of rate-limited streams that follow
-- ARGV[12..11+2L] stream, budget, ...: how many messages each rate-limited stream may
--   still take (its permits); a stream not listed has no limit. A budget above what
--   the call may send (ARGV[2]) says the limit does not bind in this call: what the
--   call leaves of that stream stays in place, in due order, instead of being set aside
-- ARGV[12+2L] K, the number of streams with a key field of their own that follow
-- ARGV[13+2L..12+2L+2K] stream, field, ...: the field that carries the business key on
--   that stream's entries (and its dead letters'), instead of ARGV[10] ("" = none)
-- ARGV[13+2L+2K..] stream, maxlen, stream, maxlen, ...: per-stream MAXLEN ~ overrides
-- returns: { forwarded, expired, dead, next_due_ms (-1 = none), now_ms,
--            { lateness_ms, ... },  { stream, count, stream, count, ... },
--            parked, held_back, newly_held, { stream, held, stream, held, ... },
--            now_us, { held_ms, ... }, { stream, worst_ms, expired, ... } }
--   lateness_ms: of each message forwarded that no held set kept; held_ms: the same
--   (forward time - due time) of each one a held set kept (a paused stream's, or a
--   rate-limited one's), whose wait was on purpose; the last list, per stream the
--   call forwarded or expired messages of: the worst lateness of its forwards no held
--   set kept (-1: none) and how many of its messages expired into its dead letters
--   the list before last counts the due messages each rate-limited stream still
--   holds after the call; now_us is the µs of now_ms already past (0-999), so that the caller can
--   wait for the next due time to the µs.
-- Rate limits: held messages that are due go in due order with the rest, each
-- held stream's as far as its budget goes (all of them once its stream has no
-- limit) and the held sets' together as far as the room the other streams' due
-- messages leave them (at least half the batch, see held_room); a held set also
-- keeps the not yet due messages pushed to a stream kept apart (see
-- schedule_batch.lua), which wait there for their time. A due message
-- of a limited stream that has no budget left, or still holds older messages,
-- moves from the pending layouts to its stream's held set instead of being sent, so
-- that it never holds up the streams behind it, and leaves after those older ones
-- (one past its ttl too: it is dead-lettered when its turn comes). next_due_ms
-- counts the held sets' earliest, and a limited stream's only once it is due
-- (its due ones wait for permits, counted in the list before last).
--        | error "FENCED ..." | the Redis error that held back the batch's first message
-- Failed writes (see own_fault in the prelude): a message whose target cannot take it
-- for reasons of its own is dead-lettered; if its dead letter cannot be written for
-- reasons of its own either, it is parked (kept, due again PARK_MS later) so that it
-- cannot hold up the shard. Any other error (OOM, READONLY, ...) stops the batch
-- there: the messages before it are committed, it and the rest stay scheduled, and
-- held_back carries the error ("" = none). Nothing is ever deleted unless its entry
-- or its dead letter was written.
-- Streams are written by name, not through KEYS: on Redis Cluster a shard is the
-- hash slot of its streams (and of their dead-letter streams, see ARGV[9]), so the
-- script still touches one slot.
local held = fenced(KEYS[5], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local now, now_us = now_ms_us()
local batch = tonumber(ARGV[2])
local id_field, attempt_field, dead_suffix, key_field = ARGV[4], ARGV[5], ARGV[6], ARGV[10]

local budget, limited = {}, {}
local n_limited = tonumber(ARGV[11])
for i = 12, 11 + 2 * n_limited, 2 do
  budget[ARGV[i]] = tonumber(ARGV[i + 1])
  limited[#limited + 1] = ARGV[i]
end
-- MAXLEN values stay the strings they came as: a Lua number is a double, and one
-- above 2^53 would reach Redis as "9.2233720368548e+18", which it refuses.
local key_fields = {}
local n_keyed = tonumber(ARGV[12 + 2 * n_limited])
local from = 13 + 2 * n_limited
for i = from, from + 2 * n_keyed - 1, 2 do key_fields[ARGV[i]] = ARGV[i + 1] end
local maxlens = {}
for i = from + 2 * n_keyed, #ARGV, 2 do maxlens[ARGV[i]] = ARGV[i + 1] end
local default_maxlen = ARGV[8]

-- Held messages that are due, read first (see the rate limits above), then merged
-- with the pending layouts' by score. from_held[id] is the held set an id was read
-- from, held_in[id] its stream; still_holds[stream] says its held set keeps due
-- messages past this call's share, all scoring at least held_upto[stream], so that
-- its messages from the pending layouts that score as much must wait behind them.
local LOOK_AHEAD, MAX_LOOK_AHEAD = 10, 2000
local due_max = now * 10 + 9
local ids, from_held, held_in, still_holds, held_upto = {}, {}, {}, {}, {}
local held_ids, held_score, read_of = {}, {}, {}
local held_streams = redis.call('SMEMBERS', KEYS[6])
-- Nothing pending anywhere in the shard (no held set, an empty index, no bucket, no
-- hash layout): the reply of a call that found nothing, before anything else is
-- built (an idle leader's calls are most of them).
if #held_streams == 0 then
  local P = pending_of(KEYS[1], KEYS[2])
  if P.ix.n == 0 and not P.hashed and redis.call('EXISTS', P.q) == 0 then
    return { 0, 0, 0, -1, now, {}, {}, 0, '', 0, {}, now_us }
  end
end
if KEYS[7] then
  for _, stream in ipairs(redis.call('SMEMBERS', KEYS[7])) do
    if not budget[stream] then limited[#limited + 1] = stream end
    budget[stream] = 0
  end
end
for _, stream in ipairs(held_streams) do
  local key = held_key(KEYS[6], stream)
  -- Each held set gives as many as the call may send (or its budget allows), so
  -- that its messages not read all come after what the call sends.
  local take = batch
  if budget[stream] then take = math.min(take, budget[stream]) end
  local got = {}
  if take > 0 then got = redis.call('ZRANGEBYSCORE', key, '-inf', due_max, 'WITHSCORES', 'LIMIT', 0, take) end
  for j = 1, #got, 2 do
    local id = got[j]
    held_ids[#held_ids + 1] = id
    held_score[id], from_held[id], held_in[id] = tonumber(got[j + 1]), key, stream
  end
  read_of[stream] = #got / 2
  if redis.call('ZCOUNT', key, '-inf', due_max) > #got / 2 then
    still_holds[stream] = true
    held_upto[stream] = tonumber(got[#got]) or -1
  end
end
-- With limits, the due set is read further ahead than a batch: what waits for its
-- stream's limit is only set aside, so that a limited stream's backlog in front of
-- other streams' messages is cleared in a few calls. Only when a limited stream may
-- have to wait, though: one whose budget is above all this call can send, and that
-- holds nothing older, does not (its limit is above what the shard moves).
-- The pending layouts give a batch too: the call sends the first `batch` of both.
local look = batch
local may_wait = false
for stream, left in pairs(budget) do
  if left - (read_of[stream] or 0) <= look or still_holds[stream] then
    may_wait = true
    break
  end
end
if may_wait then look = look + math.min(LOOK_AHEAD * batch, MAX_LOOK_AHEAD) end
-- Due messages in due order, from both pending layouts (see the prelude): the due set
-- and the compact layout's buckets, merged by score. in_bucket[id] is the bucket list
-- an id was read from (its body comes with it: bucket_body[id]). The due set is read
-- only while the hash layout holds anything. bucket_lens and bucket_next: what the
-- buckets' reads showed of the rest (see buckets_due), so that it is not asked again.
local P = pending_of(KEYS[1], KEYS[2])
local due_scores, in_bucket, bucket_floor, bucket_body = {}, {}, {}, {}
local queued, bucket_lens, bucket_next = { n = 0 }, {}, nil
if look > 0 then
  local due = {}
  if P.hashed then
    due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now * 10 + 9, 'WITHSCORES', 'LIMIT', 0, look)
  end
  queued, bucket_lens, bucket_next = buckets_due(P, now * 10 + 9, look)
  local i, j = 1, 1
  local q_score, q_id, q_body, q_key, q_name = queued.score, queued.id, queued.body, queued.key, queued.name
  for _ = 1, look do
    local from_set = due[i] and (j > queued.n or tonumber(due[i + 1]) <= q_score[j])
    if from_set then
      ids[#ids + 1] = due[i]
      due_scores[due[i]] = due[i + 1]
      i = i + 2
    elseif j <= queued.n then
      local id, key = q_id[j], q_key[j]
      ids[#ids + 1] = id
      due_scores[id], in_bucket[id], bucket_floor[key], bucket_body[id] = q_score[j], key, q_name[j], q_body[j]
      j = j + 1
    else
      break
    end
  end
end
-- The held messages read go in among the others by score (ahead of their equals):
-- each held set gave its own in order, so only messages of several need sorting.
if #held_ids > 0 then
  if #held_streams > 1 then
    table.sort(held_ids, function(a, b)
      local x, y = held_score[a], held_score[b]
      if x ~= y then return x < y end
      return id_less(a, b)
    end)
  end
  local merged, j = {}, 1
  for _, id in ipairs(held_ids) do
    local score = held_score[id]
    while ids[j] and tonumber(due_scores[ids[j]]) < score do
      merged[#merged + 1] = ids[j]
      j = j + 1
    end
    merged[#merged + 1] = id
    due_scores[id] = score
  end
  for k = j, #ids do merged[#merged + 1] = ids[k] end
  ids = merged
end

-- A stream's dead-letter stream: <stream><suffix>; on Redis Cluster in the stream's
-- own slot, so <stream><suffix> only when the name has a hash tag, else
-- {<stream>}<suffix> (as store::cluster_dead_letter_stream names it).
local in_cluster = ARGV[9] == 'cluster'
local function dead_letter_stream(stream)
  if not in_cluster then return stream .. dead_suffix end
  local open = string.find(stream, '{', 1, true)
  local close = open and string.find(stream, '}', open + 1, true)
  if close and close > open + 1 then return stream .. dead_suffix end
  return '{' .. stream .. '}' .. dead_suffix
end

-- Last resort for a message that cannot reach its stream or its dead-letter stream.
-- returns: the entry id, or nil and the error.
local function unreadable(id, why, body)
  local res = redis.pcall('XADD', ARGV[7], '*', 'delayq-id', id, 'delayq-reason', why, 'delayq-body', body)
  if type(res) == 'table' then return nil, res.err end
  return res, nil
end
local PARK_MS = 60000

local forwarded, expired, dead = 0, 0, 0
local lateness, held_lateness, per_stream, per_stream_order = {}, {}, {}, {}
-- Per stream: { worst lateness not held, expired }, and the streams in first-seen order.
local times, times_order = {}, {}
local function times_of(stream)
  local t = times[stream]
  if not t then
    t = { -1, 0 }
    times[stream] = t
    times_order[#times_order + 1] = stream
  end
  return t
end
local recorded, records, moved, parked = {}, {}, {}, {}
-- Each recorded message's target stream, for the journal's outbox and the finished
-- lists (only while either is on).
local targets = {}
local targeting = (function()
  local _, _, journaling, listing = records_policy(ARGV[3])
  return journaling or listing
end)()
local held_back = ''
-- Due messages that wait for their stream's budget: stream -> { score, id, ... }.
local to_hold, hold_order, newly_held = {}, {}, 0
-- Streams whose held messages this call leaves for want of room (see held_room).
local capped = {}

-- Whether a due message of stream scoring score, read from a pending layout, waits
-- in its held set: its stream has no budget left, holds due messages not read that
-- may score less, or has a held message this call leaves for want of room.
local function must_wait(stream, score)
  if capped[stream] then return true end
  local left = budget[stream]
  if left == nil then return false end
  if left <= 0 or (still_holds[stream] and tonumber(score) >= held_upto[stream]) then return true end
  budget[stream] = left - 1
  return false
end

-- Bodies of held messages and of the due set's, from the bodies hash.
local bodies = {}
do
  local wanted, at = {}, {}
  for i, id in ipairs(ids) do
    if in_bucket[id] then
      bodies[i] = bucket_body[id]
    else
      wanted[#wanted + 1] = id
      at[#wanted] = i
    end
  end
  if #wanted > 0 then
    local got = chunked({ 'HMGET', KEYS[2] }, wanted)
    for k = 1, #wanted do bodies[at[k]] = got[k] end
  end
end

-- Room for the other streams: while the pending layouts give the call due messages
-- of streams without a limit in it and without a held set, the held sets send at
-- most what those leave of the batch, and never less than half of it. A held
-- backlog whose limit does not bind (the leader moves less than the limit) then
-- shares each call with the streams behind it instead of holding them up until it
-- is through. held_room: how many held messages the call may send; stream_at[i]:
-- the stream read off a pending message's body on the way (the loop below reads it
-- there). A held message left for want of room caps its stream (capped): its
-- messages later in the call wait behind it, in its held set (see must_wait).
local held_room, stream_at = batch, {}
if #held_ids > 0 and #ids > #held_ids then
  local others, half = 0, math.floor(batch / 2)
  for i, id in ipairs(ids) do
    if others >= half then break end
    if not held_in[id] then
      local body = bodies[i]
      local stream = body and body_stream(body)
      stream_at[i] = stream
      -- read_of names every stream with a held set (read above).
      if not stream or (budget[stream] == nil and not read_of[stream]) then others = others + 1 end
    end
  end
  held_room = batch - others
end

-- Writes a dead letter for a message whose own target refused it (`code`: corrupt or
-- unwritable, the record's `why` for the journal). Returns its record, or nil and
-- "park" (the dead letter is refused too, for reasons of its own) or the error that
-- holds back the batch.
local function dead_letter(id, why, body, attempt, code)
  local entry, err = unreadable(id, why, body)
  if entry then
    dead = dead + 1
    local rec = record('dead', entry, now, attempt, ARGV[7])
    rec.why = code
    return rec, nil
  end
  if own_fault(err) then return nil, 'park' end
  return nil, err
end

-- Sets a due message aside in its stream's held set (written below the loop).
local function hold(id, stream)
  local list = to_hold[stream]
  if not list then
    list = {}
    to_hold[stream] = list
    hold_order[#hold_order + 1] = stream
  end
  -- Everything of its stream after it waits behind it.
  still_holds[stream], held_upto[stream] = true, -1
  list[#list + 1] = due_scores[id]
  list[#list + 1] = id
  newly_held = newly_held + 1
end

-- Sends one decoded message to its stream (or, past its ttl, its dead-letter stream).
-- Returns its record, or nil and "park" or the error that holds back the batch.
local function send(id, body, msg, is_expired)
  local stream, fields, attempt, expire_at = msg.stream, msg.fields, msg.attempt, msg.expire_at
  local rec, stop
  local target = stream
  if is_expired then target = dead_letter_stream(stream) end
  local args = { 'XADD', target }
  local n = 2
  local maxlen = maxlens[target] or default_maxlen
  if maxlen ~= '0' then
    args[3] = 'MAXLEN'; args[4] = '~'; args[5] = maxlen
    n = 5
  end
  n = n + 1; args[n] = '*'
  for j = 1, #fields do args[n + j] = fields[j] end
  n = n + #fields
  if id_field ~= '' then args[n + 1] = id_field; args[n + 2] = id; n = n + 2 end
  if attempt_field ~= '' then args[n + 1] = attempt_field; args[n + 2] = int_text(attempt); n = n + 2 end
  if msg.key then
    local field = key_fields[msg.stream] or key_field
    if field ~= '' then args[n + 1] = field; args[n + 2] = msg.key; n = n + 2 end
  end
  if is_expired then
    args[n + 1] = 'delayq-reason'; args[n + 2] = 'expired'
    args[n + 3] = 'delayq-due'; args[n + 4] = msg.due
  end
  -- Through pcall: a script error is not rolled back, so one bad target must not
  -- abort the batch after earlier entries were written.
  local entry = redis.pcall(unpack(args))
  if type(entry) == 'table' then
    if own_fault(entry.err) then
      rec, stop = dead_letter(id, 'cannot write to ' .. target .. ': ' .. tostring(entry.err), body, attempt, 'unwritable')
    else
      stop = entry.err
    end
  elseif is_expired then
    rec = record('expired', entry, now, attempt, target)
    expired = expired + 1
    local t = times_of(stream)
    t[2] = t[2] + 1
  else
    -- A delivery's time is its entry id's, which readers take when the record has
    -- no first delivery time; a redelivered message keeps its first one.
    local first_delivered = msg.first_delivered
    if type(first_delivered) ~= 'number' or first_delivered <= 0 then first_delivered = nil end
    rec = record('delivered', entry, now, attempt, stream, first_delivered, tonumber(msg.priority) or 0, expire_at,
      now - msg.due)
    forwarded = forwarded + 1
    if from_held[id] then
      held_lateness[#held_lateness + 1] = now - msg.due
    else
      local late = now - msg.due
      lateness[#lateness + 1] = late
      local t = times_of(stream)
      if late > t[1] then t[1] = late end
    end
    local count = per_stream[stream]
    if not count then
      count = 0
      per_stream_order[#per_stream_order + 1] = stream
    end
    per_stream[stream] = count + 1
  end
  return rec, stop
end

-- The loop below runs once per message and is most of the script's cost: it builds
-- each XADD's arguments in one table and nothing it does not need. It sends at most
-- `batch` messages; past that, it only sets aside what waits for its stream's limit.
-- Whether a pending message's stream is read in the loop: with limited streams, or
-- once a held stream is capped.
local sent, held_sent, by_stream = 0, 0, #limited > 0
for i, id in ipairs(ids) do
  local body = bodies[i]
  local msg, why, stream
  local held_stream, stays = held_in[id], false
  -- Whether it waits for its stream's limit is decided on the stream alone, read
  -- off the body's first bytes: setting a backlog aside costs no decoding. Without
  -- limited streams nothing waits, and the stream is not read ahead. A held message
  -- whose stream has no budget left, or that finds no room left (held_room), stays
  -- where it is.
  if held_stream then
    stays = budget[held_stream] ~= nil and budget[held_stream] <= 0
    if not stays and held_sent >= held_room then
      stays = true
      capped[held_stream], by_stream = true, true
    end
  elseif body and by_stream then
    stream = stream_at[i] or body_stream(body)
    if not stream then
      msg, why = decode_body(body, in_bucket[id] and due_scores[id])
      stream = msg and msg.stream
    end
  end
  if stays then
    -- read, not sent: it leaves its held set in a later call
  elseif stream and must_wait(stream, due_scores[id]) then
    hold(id, stream)
  else
    if sent >= batch then break end
    sent = sent + 1
    if held_stream then
      held_sent = held_sent + 1
      if budget[held_stream] then budget[held_stream] = budget[held_stream] - 1 end
    end
    if body and not msg and not why then msg, why = decode_body(body, in_bucket[id] and due_scores[id]) end
    local is_expired = msg and msg.expire_at > 0 and now > msg.expire_at
    local rec, stop
    if not body then
      moved[#moved + 1] = id -- scheduled without a body: nothing to send, only forget it
    elseif not msg then
      rec, stop = dead_letter(id, why, body, 0, 'corrupt')
    else
      rec, stop = send(id, body, msg, is_expired)
    end
    if rec then
      moved[#moved + 1] = id
      recorded[#recorded + 1] = id
      records[#records + 1] = rec
      if targeting then targets[#recorded] = (msg and msg.stream) or stream or (body and body_stream(body)) or '' end
    elseif stop == 'park' then
      parked[#parked + 1] = score_of(now + PARK_MS, (msg and tonumber(msg.priority)) or 0)
      parked[#parked + 1] = id
    elseif stop then
      held_back = stop
      break
    end
  end
end

if #moved == 0 and #parked == 0 and newly_held == 0 and held_back ~= '' then
  -- Nothing was written: hand Redis's refusal back as it is.
  return redis.error_reply(held_back)
end

-- Takes ids out of the due set, out of the held set they were taken from, or out of
-- their bucket (a prefix of each bucket: the messages are handled in order and the
-- first that is not stays, with all after it). Returns how many left a bucket.
local function unschedule(list)
  local from_due, by_held = {}, {}
  local taken, bucket_ids = {}, {}
  for _, id in ipairs(list) do
    local key, bucket = from_held[id], in_bucket[id]
    if bucket then
      taken[bucket] = (taken[bucket] or 0) + 1
      bucket_ids[#bucket_ids + 1] = id
    elseif key then
      by_held[key] = by_held[key] or {}
      table.insert(by_held[key], id)
    else
      from_due[#from_due + 1] = id
    end
  end
  chunked({ 'ZREM', KEYS[1] }, from_due)
  for key, held_ids in pairs(by_held) do chunked({ 'ZREM', key }, held_ids) end
  if #bucket_ids > 0 then buckets_consume(P, taken, bucket_floor, bucket_ids, due_scores, bucket_lens) end
  return #bucket_ids
end

-- The bodies of messages from buckets that stay pending in the hash layout (held or
-- parked), written there.
local function keep_bodies(list)
  local args = {}
  for _, id in ipairs(list) do
    if in_bucket[id] then
      args[#args + 1] = id
      args[#args + 1] = full_body(bucket_body[id], due_scores[id])
    end
  end
  chunked({ 'HSET', KEYS[2] }, args)
  P.hashed = true
end

-- Everything leaves where it was at once: a bucket gives up a prefix of its messages.
local leaving = {}
for _, id in ipairs(moved) do leaving[#leaving + 1] = id end
local park_ids = {}
for i = 2, #parked, 2 do
  park_ids[#park_ids + 1] = parked[i]
  leaving[#leaving + 1] = parked[i]
end
local hold_ids = {}
for _, stream in ipairs(hold_order) do
  local list = to_hold[stream]
  for i = 2, #list, 2 do
    hold_ids[#hold_ids + 1] = list[i]
    leaving[#leaving + 1] = list[i]
  end
end
local left_buckets = 0
if #leaving > 0 then
  left_buckets = unschedule(leaving)
  local hashed_moved = {}
  for _, id in ipairs(moved) do
    if not in_bucket[id] then hashed_moved[#hashed_moved + 1] = id end
  end
  chunked({ 'HDEL', KEYS[2] }, hashed_moved)
end
if #parked > 0 then
  keep_bodies(park_ids)
  chunked({ 'ZADD', KEYS[1] }, parked)
  P.hashed = true
end
if #hold_ids > 0 then keep_bodies(hold_ids) end
for _, stream in ipairs(hold_order) do
  chunked({ 'ZADD', held_key(KEYS[6], stream) }, to_hold[stream])
  redis.call('SADD', KEYS[6], stream)
end
-- A held set emptied by this call leaves the list of held streams (none can have
-- when there were none and this call held nothing back). held_next: the earliest
-- score in the held sets that a call can send when due: the earliest of a stream
-- without a limit in this call, and the earliest not yet due of a limited one (its
-- due ones wait for permits, which the caller counts from `holding`).
local held_next
if #held_streams > 0 or #hold_order > 0 then
  for _, stream in ipairs(redis.call('SMEMBERS', KEYS[6])) do
    local key = held_key(KEYS[6], stream)
    local from = '-inf'
    if budget[stream] then from = '(' .. due_max end
    local first = redis.call('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]
    if first then
      first = tonumber(first)
      if not held_next or first < held_next then held_next = first end
    elseif redis.call('EXISTS', key) == 0 then
      redis.call('SREM', KEYS[6], stream)
    end
  end
end
local holding = {}
for _, stream in ipairs(limited) do
  local n = redis.call('ZCOUNT', held_key(KEYS[6], stream), '-inf', due_max)
  if n > 0 then
    holding[#holding + 1] = stream
    holding[#holding + 1] = n
  end
end
if #recorded > 0 then
  -- A new generation is sized for what is due already (a backlog about to be
  -- recorded), not for what is pending: far-future messages would leave it sparse.
  local function due_now()
    local buckets = redis.call('ZLEXCOUNT', P.q, '-', '(' .. score_bytes(now * 10 + 10))
    return redis.call('ZCOUNT', KEYS[1], '-inf', now * 10 + 9) + buckets * PENDING_BUCKET * 3 / 4 + #recorded
  end
  keep_records(KEYS[3], KEYS[4], recorded, records, now, ARGV[3], due_now, targeting and targets or nil)
end

-- The earliest due time left: known from the buckets' reads when the hash layout
-- holds nothing and every message read from the buckets has left them (so that the
-- first not due, or none, is now the first of all); asked otherwise.
local next_due = -1
local first
if not P.hashed and bucket_next ~= nil and left_buckets == queued.n then
  first = bucket_next or nil
else
  first = pending_first(P)
end
if held_next and (not first or held_next < first) then first = held_next end
if first then next_due = math.floor(first / 10) end

local counts = {}
for _, stream in ipairs(per_stream_order) do
  counts[#counts + 1] = stream
  counts[#counts + 1] = per_stream[stream]
end
local per_stream_times = {}
for _, stream in ipairs(times_order) do
  local t = times[stream]
  per_stream_times[#per_stream_times + 1] = stream
  per_stream_times[#per_stream_times + 1] = t[1]
  per_stream_times[#per_stream_times + 1] = t[2]
end
return { forwarded, expired, dead, next_due, now, lateness, counts, #parked / 2, held_back, newly_held, holding, now_us, held_lateness, per_stream_times }
