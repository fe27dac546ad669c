-- schedule_batch.lua: store messages of one or more shards, idempotently by id, and
-- acknowledge the inbox entries they came from, in one atomic call: an inbox entry is
-- acknowledged (and deleted from the inbox) exactly when its message is stored. Every
-- message is stored through here: a single push is a batch of one. On standalone Redis
-- one call carries several shards (a call costs Redis more than a message does); on
-- Redis Cluster, one (its keys must share a slot).
-- KEYS, six per shard, shard g's at KEYS[6g-5 .. 6g]:
--   due set, bodies, records, records by expiry, fence,
--   held streams (a held message replaced here leaves its held set)
-- ARGV[1] epoch (0 for producers)
-- ARGV[2] max delay ms: a due time further than this from now is refused, per message
-- ARGV[3] wake-up channel, published to with a shard's due set when its earliest due time moves earlier
-- ARGV[4] inbox stream ("" = no entries to acknowledge)
-- ARGV[5] inbox consumer group; for a marked read stored whole, the group, a newline and
--   the read's consumer: the read is settled (see 15-inbox.lua) instead of each entry
--   acknowledged, and an entry too far ahead is made pending for the read's node
-- ARGV[6] the pending layout to store messages in: "compact" | "hash" (see the prelude)
-- ARGV[7] A, the number of streams kept apart that follow (streams.max_rate)
-- ARGV[8..7+A] streams kept apart: a message to one goes straight to that stream's
--   held set (scored by its due time, its body in the bodies hash), not into the
--   pending layout, so that a backlog of a rate-limited stream never lies in front of
--   the other streams' messages (see Held in the prelude)
-- ARGV[8+A] C, the number of contexts that follow: what messages of the call share,
--   carried once (an argument costs Redis about 0.09 µs to take in, more than most of
--   a message's values are worth), six values each: mode ("new" | "replace" | "fresh":
--   an id the caller has just made, which nothing can hold, stored without looking it
--   up), g (the shard's place in KEYS, from 1), due kind ("in": the due value is a
--   delay in ms; "at": epoch ms), priority 0-9, ttl ms (0 = none), target stream
-- then one record per message, in order: its context's number (1..C), its inbox entry
--   id (only when ARGV[4] names an inbox; "" = none), then the message as the
--   prelude's read_new_message reads it: id, due value, business key ("" = none;
--   listed in the shard's key index), its field/value pairs as one MessagePack array
--   of strings (stored in the body as they come)
-- returns: the outcome of each message, in order: a message stored as new answers its
--   due time alone (an integer, ms; most do, and a value is cheaper to answer than
--   three), any other three values, its status first (a string):
--   "replaced", due_ms, ""
--   | "duplicate", due_ms (0 if no longer scheduled), state
--   | "too_far", 0, text: nothing stored and the inbox entry NOT acknowledged (pending
--     for the read's node, when the call settles a marked read)
--   | error "FENCED ..."
-- The inbox stream is named in ARGV, not KEYS, like forward.lua's target streams: it
-- lives outside the shards' hash tags.
if #KEYS == 0 or #KEYS % 6 ~= 0 then
  return redis.error_reply('ERR schedule_batch takes six keys per shard, not ' .. #KEYS)
end
local shards = {}
for g = 1, #KEYS / 6 do
  local b = 6 * (g - 1)
  local held = fenced(KEYS[b + 5], ARGV[1])
  if held then return fenced_reply(held, ARGV[1]) end
  shards[g] = { keys = { KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], KEYS[b + 4] }, held = KEYS[b + 6] }
end

local now = now_ms()
local max_delay, inbox, group, layout = ARGV[2], ARGV[4], ARGV[5], ARGV[6]
local read
local newline = string.find(group, '\n', 1, true)
if newline then group, read = string.sub(group, 1, newline - 1), string.sub(group, newline + 1) end
local apart, n_apart = {}, tonumber(ARGV[7])
for a = 8, 7 + n_apart do apart[ARGV[a]] = true end
-- Every check comes before the first write (below the loop) but for the index entries
-- index_entry.enter writes as it looks ids up, which a call that fails takes back (after
-- the loop), so the call is all or nothing.
if inbox ~= '' then
  local kind = redis.call('TYPE', inbox)['ok']
  if kind ~= 'stream' and kind ~= 'none' then
    return redis.error_reply('WRONGTYPE inbox ' .. inbox .. ' is a ' .. kind .. ', not a stream')
  end
end

-- A shard's part of the call, set up when its first message comes. Bodies and scores
-- are written once for the whole call, so messages stored earlier in this call are
-- tracked here, in arrays by slot (order[k] is the id in slot k): a repeated id is a
-- duplicate of its earlier self, or replaces it. msg[k] is the message's table, or
-- its compact element (a string) for one of the common kind (see admit_all). before:
-- the shard's earliest score before the call, asked only when the hash layout is in
-- play: in the compact layout alone, the insertions tell whether a message went ahead
-- of all (P.new_first).
local function part_of(g)
  local S = shards[g]
  if not S then error('schedule_batch: a message names shard ' .. tostring(g) .. ' of ' .. #shards) end
  if not S.P then
    S.P = pending_of(S.keys[1], S.keys[2], S.keys[3])
    S.compact_only = layout == 'compact' and not S.P.hashed
    if not S.compact_only then S.before = pending_first(S.P) end
    S.slot, S.order, S.due, S.score, S.msg = {}, {}, {}, {}, {}
    S.in_way, S.unholds, S.replaced = {}, {}, {}
  end
  return S
end

-- The status of a message not yet in the call (mode "new" or "replace"), and what
-- storing it takes away (see admit). A new one bound for the compact layout is
-- looked up in the index and entered there in one command (admit then knows what
-- the index holds: no entry, or the score of the one it has); its entry is taken
-- back if it is not stored.
local function admit_into(S, id, replace, stream, score)
  local entered
  if not replace and S.compact_only and not apart[stream] then entered = index_entry.enter(S.P, id, score) end
  -- New to the index of a shard whose messages are all in the compact layout, under
  -- an id that names no score (one that names its message's score has no entry, so
  -- the index cannot vouch for it): not pending, and only a record can be in its
  -- way. admit's answer for most pushes, without its lookups; one with a record goes
  -- on to admit with it.
  local rec
  if entered == true and not placed_score(id) then
    rec = find_record(S.keys[3], id) or false
    if not rec then return 'scheduled' end
  end
  local indexed = entered
  if entered == true then indexed = false end
  local status, at, state, record_in_way, held_in, where = admit(S.keys, id, replace, indexed, rec)
  if entered == true and status == 'duplicate' then index_entry.take_back(S.P, id) end
  if record_in_way then S.in_way[#S.in_way + 1] = id end
  if held_in then S.unholds[#S.unholds + 1] = { held_in, id } end
  if where then S.replaced[#S.replaced + 1] = { id, where } end
  return status, at, state
end

local out, n_out, acks, far = {}, 0, {}, {}

-- Admits the message at ARGV[i] (its record, after its context and inbox entry:
-- read_new_message's) of the call's context, its inbox entry `entry` ("" = none), and
-- records its outcome. status, at, state: its admission's answer, when admit_into
-- gave one already (a duplicate). Returns the index of the next message's record.
local function admit_message(S, context, entry, i, status, at, state)
  local mode = context.mode
  local replace = mode == 'replace'
  local id, due_value, msg
  id, due_value, msg, i = read_new_message(ARGV, i, context)
  local due, too_far = resolve_due(context.due_kind, due_value, max_delay, now)
  local k = S.slot[id]
  if status then
    -- answered already
  elseif not due then
    status, at, state = 'too_far', 0, too_far
  elseif k and not replace then
    status, at, state = 'duplicate', S.due[k], 'scheduled'
  else
    local score = score_of(due, msg.priority)
    if k then
      status = 'replaced'
      -- Its earlier self's entry goes: index_put enters it again at its new score.
      if S.P.entered[id] then index_entry.take_back(S.P, id) end
    elseif mode == 'fresh' then
      status = 'scheduled'
    else
      status, at, state = admit_into(S, id, replace, msg.stream, score)
    end
    if status ~= 'duplicate' then
      if not k then
        k = #S.order + 1
        S.order[k], S.slot[id] = id, k
      end
      S.due[k], S.score[k], S.msg[k] = due, score, new_msg(msg, context.ttl, due, now)
      at, state = due, ''
    end
  end
  if status == 'scheduled' then
    out[n_out + 1] = at
    n_out = n_out + 1
  else
    out[n_out + 1], out[n_out + 2], out[n_out + 3] = status, at, state
    n_out = n_out + 3
  end
  if entry ~= '' then
    if status ~= 'too_far' then acks[#acks + 1] = entry else far[#far + 1] = entry end
  end
  return i
end

local function admit_all()
  local contexts, i = {}, 8 + n_apart
  local n_contexts = tonumber(ARGV[i])
  for c = 1, n_contexts do
    local b = i + 6 * (c - 1)
    local context = { mode = ARGV[b + 1], g = tonumber(ARGV[b + 2]), due_kind = ARGV[b + 3],
      priority = tonumber(ARGV[b + 4]), ttl = tonumber(ARGV[b + 5]), stream = ARGV[b + 6] }
    -- plain: its messages may be of the common kind (below); S: its shard's part.
    context.plain = (context.mode == 'new' or context.mode == 'fresh') and not apart[context.stream]
    contexts[tostring(c)] = context
  end
  i = i + 1 + 6 * n_contexts
  local with_entry = inbox ~= ''
  while i <= #ARGV do
    local context = contexts[ARGV[i]]
    if not context then
      error('schedule_batch: a message names context ' .. tostring(ARGV[i]) .. ' of ' .. n_contexts)
    end
    local entry = ''
    if with_entry then
      entry = ARGV[i + 1]
      i = i + 1
    end
    -- Most messages are of the common kind: new (or fresh), without a business key,
    -- not yet in the call, due within max_delay, bound for a shard whose messages are
    -- all in the compact layout and for a stream not kept apart. One that admission
    -- takes as new is stored as admit_message would store it, but its element is made
    -- from its values (new_body) instead of a table. Every other goes to admit_message.
    local S, id = context.S, ARGV[i + 1]
    if not S then
      S = part_of(context.g)
      context.S = S
    end
    local due = context.plain and S.compact_only and ARGV[i + 3] == '' and not S.slot[id]
      and resolve_due(context.due_kind, ARGV[i + 2], max_delay, now)
    local status, at, state
    if due then
      local score = score_of(due, context.priority)
      if context.mode == 'fresh' then
        status = 'scheduled'
      else
        status, at, state = admit_into(S, id, false, context.stream, score)
      end
      if status == 'scheduled' then
        local k = #S.order + 1
        S.order[k], S.slot[id], S.due[k], S.score[k] = id, k, due, score
        local expire_at = 0
        if context.ttl > 0 then expire_at = due + context.ttl end
        S.msg[k] = new_body(context.stream, ARGV[i + 4], context.priority, now, expire_at, score_bytes(score),
          string.char(#id), id)
        out[n_out + 1] = due
        n_out = n_out + 1
        if entry ~= '' then acks[#acks + 1] = entry end
        i = i + 5
      end
    end
    if status ~= 'scheduled' then i = admit_message(S, context, entry, i + 1, status, at, state) end
  end
end

local admitted, failure = pcall(admit_all)
if not admitted then
  -- The index as it was, but for its splits, which moved entries: its shape is kept.
  for _, S in ipairs(shards) do
    if S.P then
      for id in pairs(S.P.entered) do index_entry.take_back(S.P, id) end
      save_index(S.P)
    end
  end
  error(failure, 0)
end

-- Records and messages in the way (see admit), then the messages, shard by shard.
for _, S in ipairs(shards) do
  if S.P then
    for _, id in ipairs(S.in_way) do forget_record(S.keys[3], S.keys[4], id) end
    for _, r in ipairs(S.replaced) do
      -- A replaced message leaves its key's list (the new one joins its own below).
      local old = r[2].body and decode_body(r[2].body, r[2].score)
      if old and old.key then key_drop(key_index_of(S.keys[2], old.stream), old.key, r[1]) end
      pending_remove(S.P, r[1], r[2])
    end
    local keyed = {}
    for k, id in ipairs(S.order) do
      -- (A message stored as its element has no key.)
      local msg = S.msg[k]
      if type(msg) == 'table' and msg.key then keyed[#keyed + 1] = { msg.key, msg.stream, id } end
    end
    for _, h in ipairs(S.unholds) do unhold(S.held, h[1], h[2]) end
    if n_apart > 0 then
      -- The messages kept apart go to their held sets; the rest stay in S, in order.
      local o, sc, m, ao, asc, am = {}, {}, {}, {}, {}, {}
      for k, id in ipairs(S.order) do
        local msg = S.msg[k]
        if type(msg) == 'table' and apart[msg.stream] then
          ao[#ao + 1], asc[#asc + 1], am[#am + 1] = id, S.score[k], S.msg[k]
        else
          o[#o + 1], sc[#sc + 1], m[#m + 1] = id, S.score[k], S.msg[k]
        end
      end
      if #ao > 0 then
        S.apart_ahead = pending_add_apart(S.P, S.held, ao, asc, am)
        S.order, S.score, S.msg = o, sc, m
      end
    end
    pending_add(S.P, layout, S.order, S.score, S.msg)
    -- The index split for entries none of which stayed: its meta says so still.
    if S.P.ix.split then save_index(S.P) end
    if #keyed > 0 then key_add(S.keys[2], keyed) end
  end
end

if inbox ~= '' then
  if read then inbox_entries.settle(inbox, group, read, far) else chunked({ 'XACK', inbox, group }, acks) end
  inbox_entries.forget(inbox, group, acks)
end

-- A shard's earliest due time moved earlier exactly when this call stored a message
-- before the earliest it had (taking messages out never moves it earlier). In the
-- compact layout alone, that message went ahead of every other when it was stored
-- (one that goes ahead of its equal is told too: a wake-up to spare).
for _, S in ipairs(shards) do
  local moved_earlier
  if S.compact_only then
    moved_earlier = S.P.new_first
  else
    local first
    for _, score in ipairs(S.score or {}) do
      if not first or score < first then first = score end
    end
    moved_earlier = first and (not S.before or first < S.before)
  end
  if moved_earlier or S.apart_ahead then redis.call('PUBLISH', ARGV[3], S.keys[1]) end
end
return out
