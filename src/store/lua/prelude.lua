-- prelude.lua: helpers prepended to every script in this folder.
--
-- Message body (a shard's bodies hash, field = id): a cmsgpack array, laid out by
--   body_fields below, the one place that says which position holds which field.
--   Scripts read and write bodies only through decode_body and encode_body, by name.
-- Terminal records (delivered, expired, dead, cancelled) live in generations, so that
--   they expire a whole generation at a time and each costs about 55 bytes: the records
--   written from a generation's start until its stop (start + half the retention, at
--   least 1 s) are forgotten together, once the retention has passed after that stop, so
--   a record is kept between one and one and a half retentions. Names derive from the
--   shard's records key R:
--   R:gens   hash, generation start ms -> "stop k s n until": its buckets (linear
--            hashing: 2^k + s of them, split one at a time so that they average
--            RECORD_LOAD records), n records, deleted once Redis time passes `until`.
--   R:<start>:<b>  hash, id -> compact record; small enough for Redis's listpack encoding.
--   R:gone   hash, generation start -> buckets not yet deleted (trim deletes them a few
--            at a time; a generation there is no longer read).
--   A record is found by probing each generation, newest first, at the bucket of
--   sha1(id) (its first 32 bits); then in R itself, the hash layout (below).
-- Record parts (what scripts handle): { state, entry_id, at_ms, attempt, stream,
--   first_delivered_ms, priority, expire_at_ms }, all strings ('' where not set).
--   state is delivered | expired | dead | cancelled; entry_id is the stream entry written
--   ("" if none); first_delivered_ms (delivered and dead only) is when attempt 1 reached
--   the stream, '' when that is its own entry's time (attempt 1); priority and
--   expire_at_ms (0 = never) are a delivered message's, kept so that a redelivery keeps
--   them; '' when both are 0.
-- Compact record, its times relative to its generation's start:
--   code entry_ms_rel "-" seq "\n" stream [ "\n" at_rel "\n" attempt "\n" first_delivered_ms
--     "\n" priority "\n" expire_at_ms ]
--   code is D | E | X | C (delivered, expired, dead, cancelled); entry_ms_rel "-" seq is
--   left out when there is no entry; at_rel is '' when it is the entry's own time, attempt
--   '' when 1; the bracketed lines are left out when all are ''. (A record whose entry id
--   is not "ms-seq" is kept in the hash layout's lines, which read the same way.)
-- Hash layout (records.layout = "hash", and every record before the compact layout;
--   read, trimmed and forgotten whichever layout writes): R is a hash id -> a record of
--   five to eight lines, the parts joined by "\n" (trailing '' left out), and records
--   by expiry a sorted set: score = when records may be forgotten (ms), member =
--   at_ms "|" id [ "\n" id ... ] (one for a forward batch; an id alone even older).
-- Due set score: due_ms * 10 + (9 - priority), so equal due times go higher priority first.
-- Held (streams.max_rate): a due message of a stream at its rate limit waits in that
--   stream's held set, `<held>:<stream>`, a sorted set scored like the due set, and the
--   stream is a member of the shard's held set while it holds any. A held message keeps
--   its body in the bodies hash (with its due time): it is scheduled, only not in the
--   pending layouts. forward.lua holds and releases. Messages stored for a stream
--   kept apart (a limited one, as the caller's arguments say: pushed in
--   schedule_batch.lua, rescheduled, redelivered, replayed; pending_add_apart) go to
--   its held set, due or not: only those scoring at most now are held back; the
--   others wait for their time there, and every reader counts them by their score.

-- Lua in Redis cannot unpack more than a few thousand values into one command (its C
-- stack holds 8000), so a command built from a list of any length goes through
-- `chunked`, at most CHUNK values a call (an even number, so pairs stay whole).
-- head: the command and its leading arguments, e.g. { 'HDEL', key } or { 'XACK', stream, group }.
-- returns: the replies added up (integer replies) or joined in order (array replies).
local CHUNK = 1000
local function chunked(head, list)
  local sum, joined = 0, nil
  for first = 1, #list, CHUNK do
    local args, n = {}, #head
    for i = 1, n do args[i] = head[i] end
    for i = first, math.min(first + CHUNK - 1, #list) do
      n = n + 1
      args[n] = list[i]
    end
    local reply = redis.call(unpack(args))
    if type(reply) == 'table' then
      joined = joined or {}
      local m = #joined
      for i = 1, #reply do joined[m + i] = reply[i] end
    else
      sum = sum + reply
    end
  end
  return joined or sum
end

-- The most values a stored message's field list may hold (field, value, ...). Ingest
-- allows at most api.max_fields <= 2000 pairs; a body or entry beyond this bound did not
-- come through ingest, and one XADD of it would not fit through unpack.
local MAX_FIELD_VALUES = 6000

-- Whether a failed write is the message's own fault (its target is a key of another
-- type, or a stream that has used up its ids), so that retrying can never succeed.
-- Anything else (OOM, READONLY, MISCONF, ...) is Redis not taking writes now: the
-- message stays where it is and is tried again.
local function own_fault(err)
  return string.find(err, 'WRONGTYPE', 1, true) ~= nil or string.find(err, 'exhausted', 1, true) ~= nil
end

-- The stored message's schema: which element of a body's array holds which field.
-- Fields are added at the end: a body written before a field existed simply ends
-- before it, and reads it as nil.
local BODY_FORMAT = 1
local function body_fields(b)
  return {
    format = b[1],          -- BODY_FORMAT
    stream = b[2],          -- the target stream
    fields = b[3],          -- { field, value, ... }, XADDed as they are
    due = b[4],             -- ms
    priority = b[5],        -- 0-9: higher goes first among messages due in the same ms
    created = b[6],         -- ms, when this attempt was stored
    attempt = b[7],         -- 1, and one more for each redelivery
    expire_at = b[8],       -- ms after which it is dead-lettered as expired instead (0 = never)
    first_delivered = b[9], -- ms, when attempt 1 reached its stream  } only on a message redelivered
    reason = b[10],         -- why it was redelivered                 } because a group never acked it
  }
end

-- A body as a message table with the schema's names, or nil and a reason when it
-- cannot be read. This runs once per forwarded message: the schema's one table
-- constructor names the elements, cheaper than any loop over them. score: the
-- message's score, for a body of the compact pending layout, which leaves its due
-- time out (written as false; see compact_body).
local function decode_body(raw, score)
  local ok, b = pcall(cmsgpack.unpack, raw)
  if not ok then return nil, 'undecodable body' end
  if type(b) ~= 'table' then return nil, 'malformed body' end
  local msg = body_fields(b)
  if score and msg.due == false then msg.due = math.floor(score / 10) end
  local fields = msg.fields
  if msg.format ~= BODY_FORMAT or type(msg.stream) ~= 'string' or type(fields) ~= 'table'
      or type(msg.due) ~= 'number' or #fields == 0 or #fields % 2 ~= 0 then
    return nil, 'malformed body'
  end
  if #fields > MAX_FIELD_VALUES then return nil, 'too many fields' end
  return msg, nil
end

-- A body's target stream, read off its first bytes as encode_body writes them (an
-- array whose first element is BODY_FORMAT and second the stream), without decoding
-- the rest; nil when the body does not start that way.
local function body_stream(raw)
  local first = string.byte(raw, 1)
  local i
  if first and first >= 0x90 and first <= 0x9f then
    i = 2
  elseif first == 0xdc then
    i = 4
  else
    return nil
  end
  if string.byte(raw, i) ~= BODY_FORMAT then return nil end
  local kind, b1, b2 = string.byte(raw, i + 1, i + 3)
  local len, from
  if kind and kind >= 0xa0 and kind <= 0xbf then
    len, from = kind - 0xa0, i + 2
  elseif kind == 0xd9 and b1 then
    len, from = b1, i + 3
  elseif kind == 0xda and b2 then
    len, from = b1 * 256 + b2, i + 4
  else
    return nil
  end
  if from + len - 1 > #raw then return nil end
  return string.sub(raw, from, from + len - 1)
end

-- The schema's names by position, read off it once per call that needs them: the
-- schema applied to a probe whose elements are their own positions (a body has far
-- fewer than 64).
local body_names
local function body_layout()
  if not body_names then
    local probe = {}
    for i = 1, 64 do probe[i] = i end
    body_names = {}
    for name, i in pairs(body_fields(probe)) do body_names[i] = name end
  end
  return body_names
end

-- A message table (the schema's names) as a body. Optional fields not set at the end
-- are left out of the body, so it is exactly as long as the message needs; one not set
-- before a field that is set is written as false, so the body stays an array.
local function encode_body(msg)
  local names = body_layout()
  local body, gap = { unpack(names) }, nil -- sized once; every element is overwritten
  body[1] = BODY_FORMAT
  for i = 2, #names do
    local value = msg[names[i]]
    body[i] = value
    if value == nil then
      gap = gap or i
    elseif gap then
      for hole = gap, i - 1 do body[hole] = false end
      gap = nil
    end
  end
  return cmsgpack.pack(body)
end

-- A message table as the compact pending layout stores it: its due time left out
-- (false; 8 bytes less), as the element's score says it.
local function compact_body(msg)
  local due = msg.due
  msg.due = nil
  local raw = encode_body(msg)
  msg.due = due
  return raw
end

-- A body of the compact pending layout (score: the message's) as the bodies hash
-- keeps it, with its due time; one that cannot be read stays as it is.
local function full_body(raw, score)
  local msg = decode_body(raw, score)
  if not msg then return raw end
  return encode_body(msg)
end

-- A message table as a script answers it: the schema's fields after the format, in
-- order, each one not set as false (nil to the caller). StoredMessage::from_values reads it.
local function body_values(msg)
  local names, values = body_layout(), {}
  for i = 2, #names do
    local value = msg[names[i]]
    if value == nil then value = false end
    values[i - 1] = value
  end
  return values
end

-- One new message from a schedule call's arguments, starting at argv[i]: id, due kind,
-- due value, priority, ttl ms, stream, n, then n field/value pairs (the layout
-- NewMessage::script_args writes). Returns the id, due kind, due value and ttl, the
-- message as it will be stored (the schema's names; new_msg sets the rest), and the
-- index after it.
local function read_new_message(argv, i)
  local n = tonumber(argv[i + 6])
  local fields = {}
  for j = 1, 2 * n do fields[j] = argv[i + 6 + j] end
  local msg = { stream = argv[i + 5], fields = fields, priority = tonumber(argv[i + 3]) }
  return argv[i], argv[i + 1], argv[i + 2], tonumber(argv[i + 4]), msg, i + 7 + 2 * n
end

-- Redis's clock in ms, and the µs already past that ms.
local function now_ms_us()
  local t = redis.call('TIME')
  local usec = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(usec / 1000), usec % 1000
end

local function now_ms()
  return (now_ms_us())
end

-- Checks the caller's fence epoch against the shard's. Epoch 0 is a producer
-- (schedule, cancel, reschedule from any instance) and is never fenced.
-- Returns nil when the caller may go on, or the epoch Redis holds when it may not.
local function fenced(fence_key, epoch)
  epoch = tonumber(epoch)
  if epoch == 0 then return nil end
  local held = tonumber(redis.call('GET', fence_key) or '0')
  if held > epoch then return held end
  if epoch > held then redis.call('SET', fence_key, epoch) end
  return nil
end

local function fenced_reply(held, epoch)
  return redis.error_reply('FENCED epoch ' .. epoch .. ' is below the fence ' .. held)
end

-- A record's parts (see the format above); priority and expire_at are kept only when
-- either is not 0. at and attempt may be numbers: they are written as text only when
-- the compact record needs them (a number's text costs a sprintf).
local function record(state, entry_id, at, attempt, stream, first_delivered, priority, expire_at)
  priority, expire_at = priority or 0, expire_at or 0
  local p, e = '', ''
  if priority ~= 0 or expire_at ~= 0 then p, e = tostring(priority), tostring(expire_at) end
  return { state, entry_id, at, attempt, stream, tostring(first_delivered or ''), p, e }
end

-- A record of the hash layout as its parts; an error if it is not one.
local function record_parts(rec)
  if not string.find(rec, '\n', 1, true) then error('malformed record: ' .. rec) end
  local parts = {}
  for part in string.gmatch(rec .. '\n', '([^\n]*)\n') do parts[#parts + 1] = part end
  for i = #parts + 1, 8 do parts[i] = '' end
  return parts
end

local STATE_CODES = { delivered = 'D', expired = 'E', dead = 'X', cancelled = 'C' }
local STATE_NAMES = { D = 'delivered', E = 'expired', X = 'dead', C = 'cancelled' }

-- A record's parts as the hash layout's lines (also a compact record's, for an entry id
-- of an unknown shape).
local function record_lines(p)
  local rec = p[1] .. '\n' .. p[2] .. '\n' .. p[3] .. '\n' .. p[4] .. '\n' .. p[5]
  if p[7] ~= '' or p[8] ~= '' then return rec .. '\n' .. p[6] .. '\n' .. p[7] .. '\n' .. p[8] end
  if p[6] ~= '' then rec = rec .. '\n' .. p[6] end
  return rec
end

-- A record's parts as a compact record in the generation that starts at base. The
-- last entry milliseconds seen and their text relative to a generation's start are
-- kept between calls (they depend on nothing else): a forward call's entries mostly
-- share their milliseconds, and a number's text costs a sprintf.
local last_ms_text, last_base, last_ms, last_rel
local function compact_record(p, base)
  local entry, at, attempt = p[2], tonumber(p[3]), p[4]
  local dash = entry ~= '' and string.find(entry, '-', 1, true)
  local entry_ms, rel
  if dash then
    local ms_text = string.sub(entry, 1, dash - 1)
    if ms_text == last_ms_text and base == last_base then
      entry_ms, rel = last_ms, last_rel
    else
      entry_ms = tonumber(ms_text)
      -- Past 2^53 a double no longer holds the id's milliseconds exactly (a stream
      -- whose ids were set near 2^64 by hand): such an id is kept as its text.
      if entry_ms and entry_ms >= 9007199254740992 then entry_ms = nil end
      if entry_ms then
        rel = tostring(entry_ms - base)
        last_ms_text, last_base, last_ms, last_rel = ms_text, base, entry_ms, rel
      end
    end
  end
  local rec
  if entry_ms then
    rec = STATE_CODES[p[1]] .. rel .. string.sub(entry, dash) .. '\n' .. p[5]
  elseif entry ~= '' then
    return record_lines(p)
  else
    rec = STATE_CODES[p[1]] .. '\n' .. p[5]
  end
  if at == entry_ms then at = '' else at = at - base end
  if attempt == 1 or attempt == '1' then attempt = '' end
  if at ~= '' or attempt ~= '' or p[6] ~= '' or p[7] ~= '' or p[8] ~= '' then
    rec = rec .. '\n' .. at .. '\n' .. attempt .. '\n' .. p[6] .. '\n' .. p[7] .. '\n' .. p[8]
  end
  return rec
end

-- A stored record (compact, in the generation that starts at base, or in the hash
-- layout's lines) as its parts.
local function expand_record(rec, base)
  local state = STATE_NAMES[string.sub(rec, 1, 1)]
  if not state then return record_parts(rec) end
  local lines = {}
  for line in string.gmatch(rec .. '\n', '([^\n]*)\n') do lines[#lines + 1] = line end
  local entry, at = '', nil
  local rel = string.sub(lines[1], 2)
  if rel ~= '' then
    local ms, seq = string.match(rel, '^(%-?%d+)%-(%d+)$')
    if not ms then error('malformed record: ' .. rec) end
    at = base + tonumber(ms)
    entry = at .. '-' .. seq
  end
  if lines[3] and lines[3] ~= '' then at = base + tonumber(lines[3]) end
  if not at then error('malformed record: ' .. rec) end
  local attempt = lines[4] or ''
  if attempt == '' then attempt = '1' end
  return { state, entry, tostring(at), attempt, lines[2] or '', lines[5] or '', lines[6] or '', lines[7] or '' }
end

-- Records per bucket, on average, before the next bucket splits: low enough that even
-- a bucket not yet split (twice the average, at most) stays below the 128 entries of
-- Redis's listpack encoding.
local RECORD_LOAD = 40

-- The first 32 bits of SHA-1 of an id, computed once a call (a push asks it for the
-- pending index and for every records generation).
local id_hashes = {}
local function record_hash(id)
  local h = id_hashes[id]
  if not h then
    h = tonumber(string.sub(redis.sha1hex(id), 1, 8), 16)
    id_hashes[id] = h
  end
  return h
end

-- The generations of a records key (see the format above), oldest first, read once a call.
local generations_of = {}
local function record_gens(records)
  local gens = generations_of[records]
  if gens then return gens end
  gens = {}
  local all = redis.call('HGETALL', records .. ':gens')
  for i = 1, #all, 2 do
    local stop, k, s, n, untl = string.match(all[i + 1], '^(%d+) (%d+) (%d+) (%-?%d+) (%d+)$')
    gens[#gens + 1] = { start = tonumber(all[i]), key = records .. ':' .. all[i], stop = tonumber(stop),
      k = tonumber(k), s = tonumber(s), n = tonumber(n), untl = tonumber(untl) }
  end
  table.sort(gens, function(a, b) return a.start < b.start end)
  generations_of[records] = gens
  return gens
end

local function save_gen(records, gen)
  redis.call('HSET', records .. ':gens', gen.start,
    gen.stop .. ' ' .. gen.k .. ' ' .. gen.s .. ' ' .. gen.n .. ' ' .. gen.untl)
end

-- The bucket key of a record whose id hashes to h (names made once a call: a number's
-- text costs a sprintf).
local function record_bucket(gen, h)
  local m = 2 ^ gen.k
  local b = h % m
  if b < gen.s then b = h % (2 * m) end
  local names = gen.names
  if not names then
    names = {}
    gen.names = names
  end
  local name = names[b]
  if not name then
    name = gen.key .. ':' .. b
    names[b] = name
  end
  return name
end

-- Whether the hash layout's records hash exists, asked once a call (a push looks
-- records up for every message; keep_records sets it when it writes there).
local hash_layout_in_use = {}
local function hash_layout_has_records(records)
  local known = hash_layout_in_use[records]
  if known == nil then
    known = redis.call('EXISTS', records) == 1
    hash_layout_in_use[records] = known
  end
  return known
end

-- A record's parts, or nil: the newest generation's first, then the hash layout's.
local function find_record(records, id)
  local gens = record_gens(records)
  if #gens > 0 then
    local h = record_hash(id)
    for i = #gens, 1, -1 do
      local rec = redis.call('HGET', record_bucket(gens[i], h), id)
      if rec then return expand_record(rec, gens[i].start) end
    end
  end
  if not hash_layout_has_records(records) then return nil end
  local rec = redis.call('HGET', records, id)
  if rec then return record_parts(rec) end
  return nil
end

local function record_state(parts)
  return parts[1]
end

-- Splits the generation's next bucket in two (linear hashing).
local function split_bucket(gen)
  local m = 2 ^ gen.k
  local from, to = gen.key .. ':' .. gen.s, gen.key .. ':' .. (gen.s + m)
  local all = redis.call('HGETALL', from)
  local moving, names = {}, {}
  for i = 1, #all, 2 do
    if record_hash(all[i]) % (2 * m) ~= gen.s then
      moving[#moving + 1] = all[i]
      moving[#moving + 1] = all[i + 1]
      names[#names + 1] = all[i]
    end
  end
  if #names > 0 then
    chunked({ 'HSET', to }, moving)
    chunked({ 'HDEL', from }, names)
  end
  gen.s = gen.s + 1
  if gen.s == m then gen.k, gen.s = gen.k + 1, 0 end
end

-- ids grouped by their bucket in a linear hashing (gen: { key, k, s }, as
-- record_bucket reads it), each group a command for its bucket: { command, key, id,
-- ... } (with values, each id followed by values[i]: an HSET's field/value pairs);
-- the groups in the order their buckets were first met.
local function by_bucket(gen, command, ids, values)
  local groups, order = {}, {}
  for i, id in ipairs(ids) do
    local key = record_bucket(gen, record_hash(id))
    local list = groups[key]
    if not list then
      list = { command, key }
      groups[key] = list
      order[#order + 1] = list
    end
    list[#list + 1] = id
    if values then list[#list + 1] = values[i] end
  end
  return order
end

-- Sends a command gathered whole, { command, key, value, ... } (by_bucket's), in
-- chunks when more than CHUNK values follow the key; returns its replies added up.
local function send_gathered(list)
  if #list <= CHUNK + 2 then return redis.call(unpack(list)) end
  local rest = {}
  for i = 3, #list do rest[i - 2] = list[i] end
  return chunked({ list[1], list[2] }, rest)
end

-- Writes ids[i] -> values[i] into a linear hashing (gen, counting them in gen.n), one
-- HSET per bucket: a call costs more than a field. The buckets split first, so that
-- they have room: a bucket that once outgrows the listpack encoding would never go
-- back to it.
local function hash_into(gen, ids, values)
  while gen.n + #ids > RECORD_LOAD * (2 ^ gen.k + gen.s) do split_bucket(gen) end
  for _, list in ipairs(by_bucket(gen, 'HSET', ids, values)) do gen.n = gen.n + send_gathered(list) end
end

-- A records argument (what Store::records_arg writes): the retention in ms, prefixed
-- by "hash:" for the hash layout, the whole prefixed by "j:" while the journal is on.
-- Returns the retention, the layout and whether to journal.
local function records_policy(arg)
  local journal = string.sub(arg, 1, 2) == 'j:'
  if journal then arg = string.sub(arg, 3) end
  if string.sub(arg, 1, 5) == 'hash:' then return tonumber(string.sub(arg, 6)), 'hash', journal end
  return tonumber(arg), 'compact', journal
end

-- The journal's outbox of a shard, next to its records: a list whose every item is
-- one script call's changes, a line each (`journal_line`), that the leader copies
-- into the journal and then trims (journal_ack.lua). Written in the same script as
-- the change itself, so no change is ever missing from it.
local function journal_outbox(records)
  return records .. ':journal'
end

-- An outbox line: `<code> <id> <at ms> <entry id or -> <stream or ->` (ids, entry ids
-- and stream names have no spaces; codes as STATE_CODES, R for a new due time and
-- P for a replayed dead letter, whose "entry" is the due time).
local function journal_line(code, id, at, entry, stream)
  if entry == nil or entry == '' then entry = '-' end
  if stream == nil or stream == '' then stream = '-' end
  return code .. ' ' .. id .. ' ' .. at .. ' ' .. entry .. ' ' .. stream
end

-- Keeps records (ids[i] -> parts[i]) written now for at least the retention, in the
-- layout the policy names (see records_policy). Compact: in the current generation (a
-- new one if the newest has stopped taking records). A new generation starts with
-- buckets for as many records as the one before it took, or as `expected()` says (the
-- caller's guess, e.g. the messages already due in the shard; called only then),
-- whichever is more, so that it seldom splits: a bucket no record reaches costs
-- nothing. While the journal is on, one outbox item gets a line per record, naming
-- each message's target stream (`targets`, else the record's). Hash: one field each in the records hash, and one expiry entry for them all
-- in records_by_expiry.
local function keep_records(records, records_by_expiry, ids, parts, now, policy, expected, targets)
  local retention, layout, journal = records_policy(policy)
  if journal then
    -- The journal knows a message by its id and target stream (targets[i]; the
    -- record's stream is where it was written, a dead-letter stream maybe).
    local lines = {}
    for i, id in ipairs(ids) do
      local p = parts[i]
      lines[i] = journal_line(STATE_CODES[p[1]], id, p[3], p[2], targets and targets[i] or p[5])
    end
    redis.call('RPUSH', journal_outbox(records), table.concat(lines, '\n'))
  end
  -- A retention of 0 keeps nothing on record (the journal's line above is not one).
  if retention == 0 then return end
  if layout == 'hash' then
    local args = {}
    for i, id in ipairs(ids) do
      args[2 * i - 1], args[2 * i] = id, record_lines(parts[i])
    end
    chunked({ 'HSET', records }, args)
    redis.call('ZADD', records_by_expiry, now + retention, now .. '|' .. table.concat(ids, '\n'))
    hash_layout_in_use[records] = true
    return
  end
  local gens = record_gens(records)
  local gen = gens[#gens]
  if not gen or now >= gen.stop then
    local span = math.max(math.floor(retention / 2), 1000)
    local want = math.max(expected and expected() or 0, gen and gen.n or 0, #ids)
    local k = 0
    while 2 ^ (k + 1) * RECORD_LOAD <= want and k < 24 do k = k + 1 end
    gen = { start = now, key = records .. ':' .. now, stop = now + span, k = k, s = 0, n = 0,
      untl = now + span + retention }
    gens[#gens + 1] = gen
  end
  local recs = {}
  for i = 1, #ids do recs[i] = compact_record(parts[i], gen.start) end
  hash_into(gen, ids, recs)
  save_gen(records, gen)
end

local function keep_record(records, records_by_expiry, id, parts, now, policy, target)
  keep_records(records, records_by_expiry, { id }, { parts }, now, policy, nil, { target })
end

-- Forgets every record of id (an expiry entry of the hash layout's batches stays
-- behind: trim skips it, as the record is gone).
local function forget_record(records, records_by_expiry, id)
  redis.call('HDEL', records, id)
  redis.call('ZREM', records_by_expiry, id) -- a single id's entry, written by the oldest versions
  local gens = record_gens(records)
  if #gens == 0 then return end
  local h = record_hash(id)
  for _, gen in ipairs(gens) do
    if redis.call('HDEL', record_bucket(gen, h), id) == 1 then
      gen.n = gen.n - 1
      save_gen(records, gen)
    end
  end
end

-- Splits a stream entry's flat field list into the fields a producer sent and the
-- fields delayq appended after them: trailing pairs whose names are in `own` (a set)
-- are delayq's. Returns the producer's fields and a table name -> value of delayq's.
local function split_own_fields(flat, own)
  local n = #flat
  local found = {}
  while n >= 2 and own[flat[n - 1]] and found[flat[n - 1]] == nil do
    found[flat[n - 1]] = flat[n]
    n = n - 2
  end
  local fields = {}
  for i = 1, n do fields[i] = flat[i] end
  return fields, found
end

local function score_of(due, priority)
  return due * 10 + (9 - priority)
end

local function held_key(held, stream)
  return held .. ':' .. stream
end

-- A shard's held sets (held: its set of held streams) counted by score: counts[i] the
-- messages scoring above bounds[i - 1] and at most bounds[i], counts[#bounds + 1] those
-- past the last bound; and the earliest of their scores and `earliest` (nil: none).
local function held_classes(held, bounds, earliest)
  local counts = {}
  for i = 1, #bounds + 1 do counts[i] = 0 end
  for _, stream in ipairs(redis.call('SMEMBERS', held)) do
    local key, prev = held_key(held, stream), '-inf'
    for i, bound in ipairs(bounds) do
      counts[i] = counts[i] + redis.call('ZCOUNT', key, prev, bound)
      prev = '(' .. bound
    end
    counts[#bounds + 1] = counts[#bounds + 1] + redis.call('ZCOUNT', key, prev, '+inf')
    local first = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
    if first and (not earliest or first < earliest) then earliest = first end
  end
  return counts, earliest
end

-- Takes id out of stream's held set; returns whether it was there.
local function unhold(held, stream, id)
  local key = held_key(held, stream)
  if redis.call('ZREM', key, id) == 0 then return false end
  if redis.call('EXISTS', key) == 0 then redis.call('SREM', held, stream) end
  return true
end

-- Takes id out of the held set of the stream its body names; returns whether it was there.
local function unhold_message(bodies, held, id)
  local body = redis.call('HGET', bodies, id)
  if not body then return false end
  local msg = decode_body(body)
  return msg ~= nil and unhold(held, msg.stream, id)
end

-- Resolves a due time against now. kind "in": value is a delay in ms; "at": epoch ms.
-- Returns the due ms (a time in the past means now), or nil and the TOO_FAR text when
-- it lies more than max_delay ms after now.
local function resolve_due(kind, value, max_delay, now)
  local due = tonumber(value)
  if kind == 'in' then due = now + due end
  if due - now > tonumber(max_delay) then
    return nil, 'TOO_FAR due time ' .. due .. ' is more than max_delay ' .. max_delay .. ' ms after now ' .. now
  end
  if due < now then due = now end
  return due, nil
end

-- Pending messages (scheduled, not yet forwarded) in two layouts. Every script reads
-- and removes both; a caller that stores a message names the layout to write
-- (pending_layout), so the setting can change on live data and messages stored before
-- the compact layout are still forwarded, in order with the rest.
-- Hash layout (pending.layout = "hash"): the due set D (id -> score) and the bodies
--   hash B (id -> body). Held messages (streams.max_rate) keep their bodies in B,
--   whichever layout stored them, and so do parked ones.
-- Compact layout: the messages in score order, in lists of at most PENDING_BUCKET
--   (about 175 bytes a 100-byte message, against about 320 in the hash layout):
--   D:q        sorted set, all scores 0, of the buckets' floors: a floor is the
--              7-byte score and the id of the message the bucket started with, so that
--              Redis orders floors (bytewise) as messages are ordered; a bucket holds
--              the messages from its floor up to, not including, the next floor
--   D:q:<floor> list, the bucket's messages in (score, id) order, each one
--              score (7 bytes, big-endian) .. char(#id) .. id .. body, the body's due
--              time left out (compact_body; the score has it)
--   B:ix       string "k s n": the index's linear hashing (2^k + s buckets, split like
--              the records' buckets) and n, the messages in the compact layout
--   B:ix:<b>   hash, id -> score, small enough for Redis's listpack encoding
-- Lua compares strings with strcoll (Redis sets LC_COLLATE from its environment), so
-- elements are never compared as strings: by score, then by id byte by byte.
local PENDING_BUCKET = 128

local function score_bytes(s)
  local b = {}
  for i = 7, 1, -1 do
    b[i] = s % 256
    s = (s - b[i]) / 256
  end
  return string.char(b[1], b[2], b[3], b[4], b[5], b[6], b[7])
end

local function elem_score(e)
  local b1, b2, b3, b4, b5, b6, b7 = string.byte(e, 1, 7)
  return (((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6) * 256 + b7
end

local function elem_id(e)
  return string.sub(e, 9, 8 + string.byte(e, 8))
end

-- An element's score, id and body.
local function elem_parts(e)
  local n = string.byte(e, 8)
  return elem_score(e), string.sub(e, 9, 8 + n), string.sub(e, 9 + n)
end

local function make_elem(score, id, body)
  return score_bytes(score) .. string.char(#id) .. id .. body
end

-- Whether id a sorts before id b, byte by byte.
local function id_less(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Whether element e sorts before the message (score, id).
local function elem_before(e, score, id)
  local s = elem_score(e)
  if s ~= score then return s < score end
  return id_less(elem_id(e), id)
end

-- A shard's pending state, read once a call: { due, bodies, q, ix } where ix is
-- the index's linear hashing { key, k, s, n } (record_bucket and split_bucket work on it).
local pending_states = {}
local function pending_of(due, bodies)
  local P = pending_states[due]
  if P then return P end
  local ix = { key = bodies .. ':ix', k = 0, s = 0, n = 0 }
  local meta = redis.call('GET', ix.key)
  if meta then
    local k, s, n = string.match(meta, '^(%d+) (%d+) (%d+)$')
    if not k then error('malformed pending index ' .. ix.key .. ': ' .. meta) end
    ix.k, ix.s, ix.n = tonumber(k), tonumber(s), tonumber(n)
  end
  -- hashed: whether the hash layout holds anything (asked once a call: a push looks
  -- there for every message; pending_add sets it when it writes there). new_first
  -- (set by bucket_insert): a message stored in the compact layout during the call
  -- went ahead of every message it held then.
  P = { due = due, bodies = bodies, q = due .. ':q', ix = ix,
    hashed = redis.call('EXISTS', due, bodies) > 0 }
  pending_states[due] = P
  return P
end

local function save_index(P)
  local ix = P.ix
  if ix.n <= 0 then
    -- Empty: its buckets are gone (Redis deletes an empty hash), so it starts over.
    ix.k, ix.s, ix.n, ix.names = 0, 0, 0, nil
    redis.call('DEL', ix.key)
  else
    redis.call('SET', ix.key, ix.k .. ' ' .. ix.s .. ' ' .. ix.n)
  end
end

-- Adds ids[i] -> scores[i] to the index (none of them in it yet).
local function index_put(P, ids, scores)
  hash_into(P.ix, ids, scores)
  save_index(P)
end

local function index_del(P, ids)
  for _, list in ipairs(by_bucket(P.ix, 'HDEL', ids)) do P.ix.n = P.ix.n - send_gathered(list) end
  save_index(P)
end

-- The score of id in the compact layout, or nil.
local function index_get(P, id)
  if P.ix.n == 0 then return nil end
  local score = redis.call('HGET', record_bucket(P.ix, record_hash(id)), id)
  return score and tonumber(score)
end

local function bucket_key(P, floor)
  return P.q .. ':' .. floor
end

-- The bucket a message (score, id) belongs in: the last whose floor is not above it.
local function bucket_of(P, score, id)
  return redis.call('ZREVRANGEBYLEX', P.q, '[' .. score_bytes(score) .. id, '-', 'LIMIT', 0, 1)[1]
end

-- The position in a bucket's list of the first element that does not sort before
-- (score, id) (its length if none).
local function bucket_search(key, score, id)
  local lo, hi = 0, redis.call('LLEN', key)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if elem_before(redis.call('LINDEX', key, mid), score, id) then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- The fewest messages a bucket split at a message just inserted leaves on either side.
local MIN_SPLIT = PENDING_BUCKET / 8

-- Splits a bucket list that has grown to len past PENDING_BUCKET: its second half
-- becomes a bucket of its own (and P.tail, if the list was the tail's). cut: where the
-- second part starts instead, if both parts keep MIN_SPLIT messages or more.
local function bucket_split(P, list, len, cut)
  if len <= PENDING_BUCKET then return end
  local half = math.floor(len / 2)
  if cut and cut >= MIN_SPLIT and len - cut >= MIN_SPLIT then half = cut end
  local moving = redis.call('LRANGE', list, half, -1)
  local second = string.sub(moving[1], 1, 7) .. elem_id(moving[1])
  redis.call('ZADD', P.q, 0, second)
  chunked({ 'RPUSH', bucket_key(P, second) }, moving)
  redis.call('LTRIM', list, 0, half - 1)
  local tail = P.tail
  if tail and tail.list == list then tail.list, tail.len = bucket_key(P, second), len - half end
end

-- A new last bucket whose floor is (score, id), the tail from now on (still empty: its
-- last message is the full one's until the caller pushes): what a message that sorts
-- after every other starts when the last bucket is full, rather than split it, so
-- that messages that come in order fill their buckets whole. Only for the last
-- bucket's tail (one without upto).
local function bucket_start(P, score, id)
  local floor = score_bytes(score) .. id
  redis.call('ZADD', P.q, 0, floor)
  local last = P.tail
  P.tail = { list = bucket_key(P, floor), score = last.score, id = last.id, len = 0 }
  return P.tail
end

-- Whether (score, id) sorts before (score2, id2).
local function key_before(score, id, score2, id2)
  if score ~= score2 then return score < score2 end
  return id_less(id, id2)
end

-- Stores one message (not yet in the compact layout) that does not sort after the
-- tail (pending_add appends those) in its bucket, splitting a bucket that grows past
-- PENDING_BUCKET in two. The index is the caller's (index_put).
local function bucket_insert(P, score, id, body)
  local elem = make_elem(score, id, body)
  local floor = bucket_of(P, score, id)
  -- Whether it goes ahead of every message of the layout: before every bucket, or
  -- first in the first one (see P.new_first).
  local first_of_all = not floor
  if not floor then
    -- Before every bucket: the first one starts here now, or it is the first.
    local first = redis.call('ZRANGE', P.q, 0, 0)[1]
    local new = score_bytes(score) .. id
    if first then
      redis.call('RENAME', bucket_key(P, first), bucket_key(P, new))
      redis.call('ZREM', P.q, first)
      P.tail = nil
    end
    redis.call('ZADD', P.q, 0, new)
    floor = new
  end
  local key = bucket_key(P, floor)
  local last = redis.call('LINDEX', key, -1)
  local len, cut
  if not last or elem_before(last, score, id) then
    len = redis.call('RPUSH', key, elem)
    if not P.tail then
      -- Its bucket's end is where the messages after it in this call go too, up to
      -- the next bucket's floor (upto, read when first asked: see tail_upto).
      P.tail = { list = key, score = score, id = id, len = len, upto_unread = true }
    end
  else
    local pos = bucket_search(key, score, id)
    local pivot = redis.call('LINDEX', key, pos)
    len = redis.call('LINSERT', key, 'BEFORE', pivot, elem)
    if pos == 0 and not first_of_all then first_of_all = redis.call('ZRANGE', P.q, 0, 0)[1] == floor end
    -- Only ahead of messages due later: among messages due at one time (a burst
    -- pushed out of id order) halves stay the rule.
    if elem_score(pivot) ~= score then cut = pos + 1 end
  end
  -- The tail's count stays true when a message lands in its bucket out of order.
  if P.tail and P.tail.list == key then P.tail.len = len end
  if first_of_all then P.new_first = true end
  -- A bucket that overflows with a message ahead of ones due later is split right after it:
  -- messages that follow it in order (a steady stream ahead of a backlog due later)
  -- then find it last in its bucket, and append there (see pending_add).
  bucket_split(P, key, len, cut)
end

-- The floor of the bucket after the tail's, as (score, id), or nil when the tail's is
-- the last. Read when first asked (most calls store one message in a shard and never
-- ask), from the bucket the tail's list is then (a split may have moved it on).
local function tail_upto(P, tail)
  if tail.upto_unread then
    tail.upto_unread = nil
    local floor = string.sub(tail.list, #P.q + 2)
    local upto = redis.call('ZRANGEBYLEX', P.q, '(' .. floor, '+', 'LIMIT', 0, 1)[1]
    if upto then tail.upto_score, tail.upto_id = elem_score(upto), string.sub(upto, 8) end
  end
  return tail.upto_score, tail.upto_id
end

-- Where id's element is, given its score: the bucket's floor and key and the element;
-- nil if it is not there.
local function bucket_find(P, id, score)
  local floor = bucket_of(P, score, id)
  if not floor then return nil end
  local key = bucket_key(P, floor)
  local e = redis.call('LINDEX', key, bucket_search(key, score, id))
  if e and elem_score(e) == score and elem_id(e) == id then return floor, key, e end
  return nil
end

-- Takes an element out of its bucket (and the bucket out of D:q once empty).
local function bucket_remove(P, name, key, elem)
  P.tail = nil
  redis.call('LREM', key, 1, elem)
  if redis.call('EXISTS', key) == 0 then redis.call('ZREM', P.q, name) end
end

-- Where a scheduled id is: { layout = 'compact', score, body, name, key, elem }
-- | { layout = 'hash', score (nil while held), body (nil: scheduled without one) } | nil.
-- Read a body with decode_body(where.body, where.score): a compact one has no due time.
-- indexed: the id's score in the index, or false, if the caller has asked it already.
local function pending_find(P, id, indexed)
  local score = indexed
  if score == nil then score = index_get(P, id) end
  if score then
    local name, key, elem = bucket_find(P, id, score)
    if not name then error('pending index names ' .. id .. ' at ' .. score .. ' but no bucket has it') end
    local _, _, body = elem_parts(elem)
    return { layout = 'compact', score = score, body = body, name = name, key = key, elem = elem }
  end
  if not P.hashed then return nil end
  local due = redis.call('ZSCORE', P.due, id)
  local body = redis.call('HGET', P.bodies, id)
  if not due and not body then return nil end
  return { layout = 'hash', score = due and tonumber(due), body = body or nil }
end

-- Takes a found message out of its layout (a held one stays in its held set: the
-- caller's to unhold).
local function pending_remove(P, id, where)
  if where.layout == 'compact' then
    bucket_remove(P, where.name, where.key, where.elem)
    index_del(P, { id })
  else
    redis.call('ZREM', P.due, id)
    redis.call('HDEL', P.bodies, id)
  end
end

-- Stores messages (none of them pending) in the layout named: ids[i], scores[i],
-- msgs[i] (message tables, the schema's names).
local function pending_add(P, layout, ids, scores, msgs)
  if #ids == 0 then return end
  if layout == 'hash' then
    local b, z = {}, {}
    for i, id in ipairs(ids) do
      b[2 * i - 1], b[2 * i] = id, encode_body(msgs[i])
      z[2 * i - 1], z[2 * i] = scores[i], id
    end
    chunked({ 'HSET', P.bodies }, b)
    chunked({ 'ZADD', P.due }, z)
    P.hashed = true
    return
  end
  -- Taken in (score, id) order, whatever order they came in (pushes that arrive
  -- together, a batch whose ids were made elsewhere), so that a call's messages that
  -- sort after every other append to the last bucket rather than each search it.
  -- Ids are compared as Lua compares strings (strcoll, above): byte by byte where
  -- Redis runs in the C locale, which is all this needs to be quick; in another, an
  -- order of its own, and a message that order puts out of place is still stored
  -- where it belongs, by bucket_insert.
  local function roughly_before(a, b)
    if scores[a] ~= scores[b] then return scores[a] < scores[b] end
    return ids[a] < ids[b]
  end
  for i = 2, #ids do
    if roughly_before(i, i - 1) then
      local by = {}
      for j = 1, #ids do by[j] = j end
      table.sort(by, roughly_before)
      local ids2, scores2, msgs2 = {}, {}, {}
      for j, k in ipairs(by) do ids2[j], scores2[j], msgs2[j] = ids[k], scores[k], msgs[k] end
      ids, scores, msgs = ids2, scores2, msgs2
      break
    end
  end
  -- Whether message i goes at the tail's end: after its last message and, when a
  -- bucket follows, before that bucket's floor.
  local function at_tail(tail, i)
    if not key_before(tail.score, tail.id, scores[i], ids[i]) then return false end
    local upto_score, upto_id = tail_upto(P, tail)
    return not upto_score or key_before(scores[i], ids[i], upto_score, upto_id)
  end
  local i = 1
  while i <= #ids do
    local tail = P.tail
    if tail and at_tail(tail, i) and (tail.len < PENDING_BUCKET or not tail_upto(P, tail)) then
      -- Messages that come in order (a batch due at one time, or later and later)
      -- go to the end of the bucket the call last appended to, which P.tail
      -- remembers within a call: its list, its length, the (score, id) of its last
      -- message and, when another bucket follows, that one's floor (upto_score,
      -- upto_id); anything that takes a message out of a bucket forgets it
      -- (bucket_remove, buckets_consume). A run of them is appended a bucketful at a
      -- time. A full last bucket is followed by a new one; a full one that another
      -- follows is split (bucket_insert).
      if tail.len >= PENDING_BUCKET then tail = bucket_start(P, scores[i], ids[i]) end
      local elems = {}
      while i <= #ids and #elems < PENDING_BUCKET - tail.len and at_tail(tail, i) do
        elems[#elems + 1] = make_elem(scores[i], ids[i], compact_body(msgs[i]))
        tail.score, tail.id = scores[i], ids[i]
        i = i + 1
      end
      tail.len = redis.call('RPUSH', tail.list, unpack(elems))
    else
      bucket_insert(P, scores[i], ids[i], compact_body(msgs[i]))
      i = i + 1
    end
  end
  index_put(P, ids, scores)
end

-- The earliest score pending in the due set or the buckets, or nil. The due set is
-- read only while the hash layout holds anything (P.hashed).
local function pending_first(P)
  local best
  if P.hashed then
    local first = redis.call('ZRANGE', P.due, 0, 0, 'WITHSCORES')
    if first[1] then best = tonumber(first[2]) end
  end
  local name = redis.call('ZRANGE', P.q, 0, 0)[1]
  if name then
    local e = redis.call('LINDEX', bucket_key(P, name), 0)
    if e then
      local s = elem_score(e)
      if not best or s < best then best = s end
    end
  end
  return best
end

-- Stores messages (none of them pending) kept apart: each in the held set of its
-- stream (held: the shard's set of held streams), scored as in the layouts, its body
-- in the bodies hash (see Held). Returns whether one goes ahead of every message of
-- the layouts and of the held sets it goes to: a wake-up is due (one ahead only of
-- those is told too, to spare).
local function pending_add_apart(P, held, ids, scores, msgs)
  local before = pending_first(P)
  local by_stream, streams, bodies = {}, {}, {}
  for k, id in ipairs(ids) do
    local stream = msgs[k].stream
    if not by_stream[stream] then
      by_stream[stream] = {}
      streams[#streams + 1] = stream
      local first = tonumber(redis.call('ZRANGE', held_key(held, stream), 0, 0, 'WITHSCORES')[2])
      if first and (not before or first < before) then before = first end
    end
    local z = by_stream[stream]
    z[#z + 1], z[#z + 2] = scores[k], id
    bodies[#bodies + 1], bodies[#bodies + 2] = id, encode_body(msgs[k])
  end
  local ahead = false
  for _, sc in ipairs(scores) do ahead = ahead or not before or sc < before end
  chunked({ 'HSET', P.bodies }, bodies)
  P.hashed = true
  for _, stream in ipairs(streams) do
    chunked({ 'ZADD', held_key(held, stream) }, by_stream[stream])
    redis.call('SADD', held, stream)
  end
  return ahead
end

-- Stores one message (not pending), kept apart when `apart` (its stream has a rate
-- limit, as the caller's arguments say) or else in the layout named. Returns whether
-- a wake-up is due: it goes ahead of every message of the layouts (and of its held
-- set, kept apart).
local function pending_add_one(P, held, layout, apart, id, score, msg)
  if apart then return pending_add_apart(P, held, { id }, { score }, { msg }) end
  pending_add(P, layout, { id }, { score }, { msg })
  return pending_first(P) == score
end

-- A bucket is read FIRST_LOOK elements at a time at first: a forward at a steady
-- rate finds a few due in a call, and every element read costs a Lua string.
local FIRST_LOOK = 16

-- Up to limit messages of the buckets scoring at most max, in order: { n, score,
-- id, body, key, name }, n of them, the rest arrays by position (key: the bucket's
-- list; name: its floor). Also returns what the reads showed of the rest: the
-- buckets' lengths where a read reached a list's end ({ [key] = length }), and the
-- earliest score left after the messages returned: a score, false when no bucket has
-- more, or nil when the reads did not get that far.
local function buckets_due(P, max, limit)
  local Q = { n = 0, score = {}, id = {}, body = {}, key = {}, name = {} }
  local scores, ids, bodies, keys, floors = Q.score, Q.id, Q.body, Q.key, Q.name
  local n, lens = 0, {}
  local function done(next_score)
    Q.n = n
    return Q, lens, next_score
  end
  local rank = 0
  while n < limit do
    local names = redis.call('ZRANGE', P.q, rank, rank + 7)
    if #names == 0 then return done(false) end
    for _, name in ipairs(names) do
      local key = bucket_key(P, name)
      local from = 0
      while true do
        local want = limit - n
        local step = want
        if from == 0 and want > FIRST_LOOK then step = FIRST_LOOK end
        local elems = redis.call('LRANGE', key, from, from + step - 1)
        if #elems < step then lens[key] = from + #elems end
        for _, e in ipairs(elems) do
          local score, id, body = elem_parts(e)
          if score > max then return done(score) end
          n = n + 1
          scores[n], ids[n], bodies[n], keys[n], floors[n] = score, id, body, key, name
        end
        if n >= limit then return done(nil) end
        if #elems < step then break end
        from = from + step
      end
    end
    if #names < 8 then return done(false) end
    rank = rank + 8
  end
  return done(nil)
end

-- Takes the first `count[key]` elements of each bucket out (what buckets_due gave and
-- the caller used), and their ids out of the index. lens: the lengths buckets_due
-- found (a bucket not in it is asked).
local function buckets_consume(P, taken, names, ids, lens)
  P.tail = nil
  for key, count in pairs(taken) do
    if (lens[key] or redis.call('LLEN', key)) <= count then
      redis.call('DEL', key)
      redis.call('ZREM', P.q, names[key])
    else
      redis.call('LTRIM', key, count, -1)
    end
  end
  if #ids > 0 then index_del(P, ids) end
end

-- Decides whether a message may be stored under id, by the idempotency rules: a
-- scheduled id, or one with a record other than a cancellation, is a duplicate unless
-- replace. Read-only: a record in the way is the caller's to forget when it writes, a
-- pending message it replaces the caller's to remove (pending_remove, then unhold).
-- keys: { due set, bodies, records, records by expiry }.
-- returns: "scheduled" | "replaced", nil, nil, record_in_way, held_stream, where (the
--          id may be stored; held_stream: the stream whose held set has it; where: the
--          pending message it replaces, as pending_find gives it)
--        | "duplicate", due (0 if no longer scheduled), state
local function admit(keys, id, replace)
  local P = pending_of(keys[1], keys[2])
  local existing, held_in = nil, nil
  -- A duplicate in the compact layout is answered from the index alone.
  local indexed = index_get(P, id) or false
  if indexed and not replace then return 'duplicate', math.floor(indexed / 10), 'scheduled' end
  local where = pending_find(P, id, indexed)
  if where then
    existing = where.score
    if not existing then
      -- Held back by its stream's rate limit: scheduled, with only its body to show it.
      local msg = where.body and decode_body(where.body)
      existing = 0
      if msg then existing, held_in = score_of(msg.due, msg.priority), msg.stream end
    end
  end
  if existing and not replace then
    return 'duplicate', math.floor(tonumber(existing) / 10), 'scheduled'
  end
  local replaced = where ~= nil
  local rec = find_record(keys[3], id) or false
  if rec then
    -- A cancelled id may be pushed again as new; a delivered, expired or dead one only with replace.
    local state = record_state(rec)
    if state ~= 'cancelled' then
      if not replace then return 'duplicate', 0, state end
      replaced = true
    end
  end
  local status = 'scheduled'
  if replaced then status = 'replaced' end
  return status, nil, nil, rec ~= false, held_in, where
end

-- A new message: msg (as read_new_message gives it) due at due, attempt 1, created
-- now; a ttl (ms, 0 = none) counts from the due time.
local function new_msg(msg, ttl, due, now)
  local expire_at = 0
  if ttl > 0 then expire_at = due + ttl end
  msg.due, msg.created, msg.attempt, msg.expire_at = due, now, 1, expire_at
  return msg
end
