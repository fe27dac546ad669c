-- 40-records.lua: terminal records (delivered, expired, dead, cancelled), in either
-- layout, and the journal's outbox lines written with them. Gives record_fields (the
-- schema), record, find_record, keep_records, keep_record, forget_record,
-- records_policy, journal_outbox, journal_line, journal_item, and the linear hashing
-- (record_bucket, split_bucket, send_by_bucket, hash_into) the pending index shares.
--
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
--   first_delivered_ms, priority, expire_at_ms, late_ms }, all strings ('' where not set).
--   state is delivered | expired | dead | cancelled; entry_id is the stream entry written
--   ("" if none); first_delivered_ms (delivered and dead only) is when attempt 1 reached
--   the stream, '' when that is its own entry's time (attempt 1); priority and
--   expire_at_ms (0 = never) are a delivered message's, kept so that a redelivery keeps
--   them; '' when both are 0. late_ms (delivered only) is how long after its due time it
--   was sent, '' when not at all (and in records written before it was kept).
-- Compact record, its times relative to its generation's start:
--   code entry_ms_rel "-" seq "\n" stream [ "\n" at_rel "\n" attempt "\n" first_delivered_ms
--     "\n" priority "\n" expire_at_ms [ "\n" late_ms ] ]
--   code is D | E | X | C (delivered, expired, dead, cancelled); entry_ms_rel "-" seq is
--   left out when there is no entry; at_rel is '' when it is the entry's own time or lies
--   at most AT_SLACK ms before it (the record's time is then its entry's: a forward call
--   reads the clock when it starts and writes its entries in the milliseconds after,
--   and a time relative to a generation's start takes up to eight digits), attempt
--   '' when 1; the bracketed lines are left out when all are ''. (A record whose entry id
--   is not "ms-seq" is kept in the hash layout's lines, which read the same way.)
-- Hash layout (records.layout = "hash", and every record before the compact layout;
--   read, trimmed and forgotten whichever layout writes): R is a hash id -> a record of
--   five to eight lines, the parts joined by "\n" (trailing '' left out), and records
--   by expiry a sorted set: score = when records may be forgotten (ms), member =
--   at_ms "|" id [ "\n" id ... ] (one for a forward batch; an id alone even older).

-- The record's schema: which of a record's parts holds which field, the one place that
-- says so. Scripts read a record found by find_record by these names; only this file
-- handles parts by position (record writes them in this order).
local function record_fields(p)
  return {
    state = p[1],           -- delivered | expired | dead | cancelled
    entry = p[2],           -- the stream entry written, '' if none
    at = p[3],              -- ms, when it reached this state
    attempt = p[4],         -- the attempt that reached it
    stream = p[5],          -- the target stream ('' for a cancelled message whose body was
                            -- unreadable, or one cancelled before records named it)
    first_delivered = p[6], -- ms, when attempt 1 reached the stream; '' for attempt 1 itself
    priority = p[7],        -- a delivered message's, '' when it and expire_at are 0
    expire_at = p[8],       -- ms, a delivered message's (0 = never), '' as priority
    late = p[9],            -- ms, how long after its due time a delivered message was sent
  }
end

-- A record's parts (see the format above); priority and expire_at are kept only when
-- either is not 0. at and attempt may be numbers: they are written as text only when
-- the compact record needs them (a number's text costs a sprintf).
local function record(state, entry_id, at, attempt, stream, first_delivered, priority, expire_at, late)
  priority, expire_at = priority or 0, expire_at or 0
  local p, e = '', ''
  if priority ~= 0 or expire_at ~= 0 then p, e = tostring(priority), tostring(expire_at) end
  local l = ''
  if late and late ~= 0 then l = tostring(late) end
  return { state, entry_id, at, attempt, stream, tostring(first_delivered or ''), p, e, l }
end

-- A record of the hash layout as its parts; an error if it is not one.
local function record_parts(rec)
  if not string.find(rec, '\n', 1, true) then error('malformed record: ' .. rec) end
  local parts = {}
  for part in string.gmatch(rec .. '\n', '([^\n]*)\n') do parts[#parts + 1] = part end
  for i = #parts + 1, 9 do parts[i] = '' end
  return parts
end

local STATE_CODES = { delivered = 'D', expired = 'E', dead = 'X', cancelled = 'C' }
local STATE_NAMES = { D = 'delivered', E = 'expired', X = 'dead', C = 'cancelled' }

-- A record's parts as the hash layout's lines (also a compact record's, for an entry id
-- of an unknown shape).
local function record_lines(p)
  local rec = p[1] .. '\n' .. p[2] .. '\n' .. p[3] .. '\n' .. p[4] .. '\n' .. p[5]
  if p[9] ~= '' then
    return rec .. '\n' .. p[6] .. '\n' .. p[7] .. '\n' .. p[8] .. '\n' .. p[9]
  end
  if p[7] ~= '' or p[8] ~= '' then return rec .. '\n' .. p[6] .. '\n' .. p[7] .. '\n' .. p[8] end
  if p[6] ~= '' then rec = rec .. '\n' .. p[6] end
  return rec
end

-- How long before its entry's time a record's own may lie and still be left out of a
-- compact record (read back as the entry's): longer than any call that writes entries.
local AT_SLACK = 1000

-- A record's parts as a compact record in the generation that starts at base. The
-- last entry milliseconds seen and their text relative to a generation's start are
-- kept between calls, in a block (they depend on nothing else): a forward call's
-- entries mostly share their milliseconds, and a number's text costs a sprintf.
local compact_record
do
  local last_ms_text, last_base, last_ms, last_rel
  compact_record = function(p, base)
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
    if entry_ms and at <= entry_ms and entry_ms - at <= AT_SLACK then at = '' else at = at - base end
    if attempt == 1 or attempt == '1' then attempt = '' end
    if at ~= '' or attempt ~= '' or p[6] ~= '' or p[7] ~= '' or p[8] ~= '' or p[9] ~= '' then
      rec = rec .. '\n' .. at .. '\n' .. attempt .. '\n' .. p[6] .. '\n' .. p[7] .. '\n' .. p[8]
      if p[9] ~= '' then rec = rec .. '\n' .. p[9] end
    end
    return rec
  end
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
  return { state, entry, tostring(at), attempt, lines[2] or '', lines[5] or '', lines[6] or '', lines[7] or '',
    lines[8] or '' }
end

-- Records per bucket, on average, before the next bucket splits: low enough that even
-- a bucket not yet split (twice the average, at most) stays below the 128 entries of
-- Redis's listpack encoding.
local RECORD_LOAD = 40

-- The first 32 bits of SHA-1 of an id, computed once a call (a push asks it for the
-- pending index and for every records generation). Its first eight hex digits are read
-- as bytes through a table: a third less than cutting them out and parsing them
-- (string.sub, tonumber), the same number.
local id_hashes = {}
local record_hash
do
  local hex_value = {}
  for d = 0, 9 do hex_value[48 + d] = d end
  for d = 0, 5 do hex_value[97 + d] = 10 + d end
  record_hash = function(id)
    local h = id_hashes[id]
    if not h then
      local c1, c2, c3, c4, c5, c6, c7, c8 = string.byte(redis.sha1hex(id), 1, 8)
      local v = hex_value
      h = ((((((v[c1] * 16 + v[c2]) * 16 + v[c3]) * 16 + v[c4]) * 16 + v[c5]) * 16 + v[c6]) * 16 + v[c7]) * 16
        + v[c8]
      id_hashes[id] = h
    end
    return h
  end
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

-- A record by the schema's names (record_fields), or nil: the newest generation's
-- first, then the hash layout's.
local function find_record(records, id)
  local gens = record_gens(records)
  if #gens > 0 then
    local h = record_hash(id)
    for i = #gens, 1, -1 do
      local rec = redis.call('HGET', record_bucket(gens[i], h), id)
      if rec then return record_fields(expand_record(rec, gens[i].start)) end
    end
  end
  if not hash_layout_has_records(records) then return nil end
  local rec = redis.call('HGET', records, id)
  if rec then return record_fields(record_parts(rec)) end
  return nil
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

-- send_by_bucket and its helpers, in a block: a script's chunk may hold at most 200
-- locals at once, prelude included.
local send_by_bucket
do
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

  -- Sends command to the bucket of each id (followed by values[i] when given: an
  -- HSET's field and value) and returns the replies added up. Ids fewer than half the
  -- buckets mostly have a bucket each, and are sent one by one as they come; more are
  -- gathered by bucket first (by_bucket): a call costs more than a field.
  send_by_bucket = function(gen, command, ids, values)
    local total = 0
    if #ids * 2 < 2 ^ gen.k + gen.s then
      for i, id in ipairs(ids) do
        local key = record_bucket(gen, record_hash(id))
        if values then
          total = total + redis.call(command, key, id, values[i])
        else
          total = total + redis.call(command, key, id)
        end
      end
    else
      for _, list in ipairs(by_bucket(gen, command, ids, values)) do total = total + send_gathered(list) end
    end
    return total
  end
end

-- Writes ids[i] -> values[i] into a linear hashing (gen, counting them in gen.n)
-- through send_by_bucket. The buckets split first, so that they have room: a bucket
-- that once outgrows the listpack encoding would never go back to it.
local function hash_into(gen, ids, values)
  while gen.n + #ids > RECORD_LOAD * (2 ^ gen.k + gen.s) do split_bucket(gen) end
  gen.n = gen.n + send_by_bucket(gen, 'HSET', ids, values)
end

-- A records argument (what Store::records_arg writes): the retention in ms, prefixed
-- by "hash:" for the hash layout, that by "n:" when finished messages are not listed
-- by stream (see 35-finished.lua), the whole prefixed by "j:" while the journal is on.
-- Returns the retention, the layout, whether to journal and whether to list.
local function records_policy(arg)
  local journal = string.sub(arg, 1, 2) == 'j:'
  if journal then arg = string.sub(arg, 3) end
  local listing = string.sub(arg, 1, 2) ~= 'n:'
  if not listing then arg = string.sub(arg, 3) end
  if string.sub(arg, 1, 5) == 'hash:' then return tonumber(string.sub(arg, 6)), 'hash', journal, listing end
  return tonumber(arg), 'compact', journal, listing
end

-- The journal's outbox of a shard, next to its records: a list whose every item is
-- one script call's changes, a line each (`journal_line`), that the leader copies
-- into the journal and then trims (journal_ack.lua). Written in the same script as
-- the change itself, so no change is ever missing from it.
local function journal_outbox(records)
  return records .. ':journal'
end

-- An outbox item of `lines` (joined by "\n"), headed "@<epoch>" when a leader's call
-- writes it (see call_epoch), so that the journal's transition log knows which term
-- made its changes.
local function journal_item(lines)
  local epoch = call_epoch[1]
  if epoch and epoch > 0 then return '@' .. string.format('%d', epoch) .. '\n' .. lines end
  return lines
end

-- An outbox line: `<code> <id> <at ms> <entry id or -> <stream or ->` (ids, entry ids
-- and stream names have no spaces; codes as STATE_CODES, R for a new due time, P for
-- a replayed dead letter, whose "entry" is the due time, A for a redelivery, whose
-- "entry" is the one no consumer acknowledged and which ends with the redelivery's
-- attempt, and W for why the dead line before it was dead-lettered, whose "entry"
-- is the reason: corrupt, unwritable or max_attempts).
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
-- each message's target stream (`targets`, else the record's); unless the policy says
-- not to, each id is listed under that stream (finished.add). Hash: one field each in the records hash, and one expiry entry for them all
-- in records_by_expiry.
local function keep_records(records, records_by_expiry, ids, parts, now, policy, expected, targets)
  local retention, layout, journal, listing = records_policy(policy)
  if journal then
    -- The journal knows a message by its id and target stream (targets[i]; the
    -- record's stream is where it was written, a dead-letter stream maybe).
    local lines = {}
    for i, id in ipairs(ids) do
      local p = parts[i]
      local target = targets and targets[i] or p[5]
      lines[#lines + 1] = journal_line(STATE_CODES[p[1]], id, p[3], p[2], target)
      -- A dead record's reason (`why`, beside its parts) for the transition log.
      if p.why then lines[#lines + 1] = journal_line('W', id, p[3], p.why, target) end
    end
    redis.call('RPUSH', journal_outbox(records), journal_item(table.concat(lines, '\n')))
  end
  -- A retention of 0 keeps nothing on record (the journal's line above is not one).
  if retention == 0 then return end
  if listing then finished.add(records, ids, parts, targets) end
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
