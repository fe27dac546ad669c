-- 80-keys.lua: business keys. Gives key_index_of, key_ids, key_add, key_drop,
-- key_prune and key_message_state.
--
-- A message may carry a business key (the body's `key`), so that a producer can find
-- or cancel every message of, say, one order without knowing their ids. Each shard
-- keeps an index of the ids pushed with a key, next to its bodies:
--   B:kx      string "k s n c": the index's linear hashing (2^k + s buckets, n fields,
--             as the pending index and the record generations use it) and c, the
--             next bucket trim prunes.
--   B:kx:<b>  hash, "<key> <stream>" -> the ids pushed with that key to that stream,
--             space-separated, oldest first; small enough for Redis's listpack
--             encoding (a key has no spaces, so the first space ends it).
-- An id stays listed after its message finishes, while its record is kept, so that a
-- key's recent deliveries can be listed too; trim drops ids that are neither pending
-- nor on record any more (key_prune), a few buckets a call. Messages without a key
-- cost nothing here.

local function key_field(key, stream)
  return key .. ' ' .. stream
end

-- A shard's key index, read once a call (by its bodies key).
local key_indexes = {}
local function key_index_of(bodies)
  local X = key_indexes[bodies]
  if X then return X end
  X = { key = bodies .. ':kx', k = 0, s = 0, n = 0, c = 0 }
  local meta = redis.call('GET', X.key)
  if meta then
    local k, s, n, c = string.match(meta, '^(%d+) (%d+) (%d+) (%d+)$')
    if not k then error('malformed key index ' .. X.key .. ': ' .. meta) end
    X.k, X.s, X.n, X.c = tonumber(k), tonumber(s), tonumber(n), tonumber(c)
  end
  key_indexes[bodies] = X
  return X
end

local function save_key_index(X)
  if X.n <= 0 then
    -- Empty: its buckets are gone (Redis deletes an empty hash), so it starts over.
    X.k, X.s, X.n, X.c, X.names = 0, 0, 0, 0, nil
    redis.call('DEL', X.key)
  else
    redis.call('SET', X.key, X.k .. ' ' .. X.s .. ' ' .. X.n .. ' ' .. X.c)
  end
end

-- The ids listed under key in stream (each once, oldest first), or an empty table.
local function key_ids(X, key, stream)
  if X.n == 0 then return {} end
  local field = key_field(key, stream)
  local value = redis.call('HGET', record_bucket(X, record_hash(field)), field)
  local ids, seen = {}, {}
  if value then
    for id in string.gmatch(value, '%S+') do
      if not seen[id] then
        seen[id] = true
        ids[#ids + 1] = id
      end
    end
  end
  return ids
end

-- Lists ids under their keys: adds[i] = { key, stream, id }, in order. One HGET and
-- one HSET per key and stream the call names.
local function key_add(X, adds)
  if #adds == 0 then return end
  local fields, order = {}, {}
  for _, a in ipairs(adds) do
    local field = key_field(a[1], a[2])
    local ids = fields[field]
    if not ids then
      ids = {}
      fields[field] = ids
      order[#order + 1] = field
    end
    ids[#ids + 1] = a[3]
  end
  -- Split first, so that the buckets have room (see hash_into).
  while X.n + #order > RECORD_LOAD * (2 ^ X.k + X.s) do split_bucket(X) end
  for _, field in ipairs(order) do
    local bucket = record_bucket(X, record_hash(field))
    local value = table.concat(fields[field], ' ')
    local old = redis.call('HGET', bucket, field)
    if old then value = old .. ' ' .. value else X.n = X.n + 1 end
    redis.call('HSET', bucket, field, value)
  end
  save_key_index(X)
end

-- Takes id off key's list in stream (a message replaced under another key).
local function key_drop(X, key, stream, id)
  if X.n == 0 then return end
  local field = key_field(key, stream)
  local bucket = record_bucket(X, record_hash(field))
  local value = redis.call('HGET', bucket, field)
  if not value then return end
  local kept = {}
  for other in string.gmatch(value, '%S+') do
    if other ~= id then kept[#kept + 1] = other end
  end
  if #kept == 0 then
    redis.call('HDEL', bucket, field)
    X.n = X.n - 1
  else
    redis.call('HSET', bucket, field, table.concat(kept, ' '))
  end
  save_key_index(X)
end

-- What became of a listed id: { 'scheduled', due ms, priority } or { 'held', due ms,
-- priority } while pending with this key and stream (held: waiting for its stream's
-- rate limit), { state, at ms, entry id } once finished and on record, or nil when
-- neither (pushed again under another key, or forgotten). where: pending_find's.
local function key_message_state(P, records, key, stream, id, where)
  where = where or pending_find(P, id)
  if where then
    local msg = where.body and decode_body(where.body, where.score)
    if not msg or msg.key ~= key or msg.stream ~= stream then return nil end
    local state = 'scheduled'
    if not where.score then state = 'held' end
    return { state, msg.due, msg.priority or 0 }, where
  end
  local rec = find_record(records, id)
  if not rec then return nil end
  -- A record does not name the key: a delivery or cancellation that names another
  -- stream tells of another message (a dead letter's names its dead-letter stream).
  if rec.stream ~= '' and rec.stream ~= stream
      and (rec.state == 'delivered' or rec.state == 'cancelled') then
    return nil
  end
  return { rec.state, tonumber(rec.at), rec.entry }
end

-- Looks at up to `buckets` buckets of the index from its cursor on, keeping the ids
-- still pending or on record (the shard's due set and bodies, its records) and
-- dropping the rest (and a key's field once it lists none). Returns the ids dropped.
local function key_prune(X, due, bodies, records, buckets)
  if X.n == 0 then return 0 end
  local P = pending_of(due, bodies)
  local dropped = 0
  local total = 2 ^ X.k + X.s
  for _ = 1, math.min(buckets, total) do
    if X.c >= total then X.c = 0 end
    local bucket = X.key .. ':' .. X.c
    local all = redis.call('HGETALL', bucket)
    for i = 1, #all, 2 do
      local kept, seen, n_ids = {}, {}, 0
      for id in string.gmatch(all[i + 1], '%S+') do
        n_ids = n_ids + 1
        if not seen[id] then
          seen[id] = true
          if pending_find(P, id) or find_record(records, id) then kept[#kept + 1] = id end
        end
      end
      if #kept == 0 then
        redis.call('HDEL', bucket, all[i])
        X.n = X.n - 1
      elseif #kept < n_ids then
        redis.call('HSET', bucket, all[i], table.concat(kept, ' '))
      end
      dropped = dropped + n_ids - #kept
    end
    X.c = X.c + 1
  end
  save_key_index(X)
  return dropped
end
