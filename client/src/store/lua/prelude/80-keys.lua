-- 80-keys.lua: business keys. Gives key_index_of, key_ids, key_add_to, key_add,
-- key_drop, key_prune and key_message_state.
--
-- A message may carry a business key (the body's `key`), so that a producer can find
-- or cancel every message of, say, one order without knowing their ids. Each shard
-- keeps, for each stream its keyed messages go to, an index of their ids, next to its
-- bodies:
--   B:keys             hash, stream -> "k s n c": that stream's index (linear hashing,
--                      as the pending index and the record generations use it: 2^k + s
--                      buckets, n keys) and c, the next bucket trim prunes.
--   B:keys:<stream>:<b>  hash, key -> the ids pushed with that key to that stream,
--                      space-separated, oldest first; small enough for Redis's listpack
--                      encoding. (<b> is a number: no two streams' buckets share a name.)
-- A key is paid once per stream and shard it is used in, an id once; the stream's
-- name once per shard. An id stays listed after its message finishes, while its record
-- is kept, so that a key's recent deliveries can be listed too; trim drops ids that
-- are neither pending nor on record any more (key_prune), a few buckets of one stream
-- a call. Messages without a key cost nothing here.

-- A shard's index of one stream, read once a call (by its bodies key and the stream).
local key_indexes = {}
local function key_index_of(bodies, stream)
  local of_shard = key_indexes[bodies]
  if not of_shard then
    of_shard = {}
    key_indexes[bodies] = of_shard
  end
  local X = of_shard[stream]
  if X then return X end
  local meta = bodies .. ':keys'
  X = { meta = meta, stream = stream, key = meta .. ':' .. stream, k = 0, s = 0, n = 0, c = 0 }
  local state = redis.call('HGET', meta, stream)
  if state then
    local k, s, n, c = string.match(state, '^(%d+) (%d+) (%d+) (%d+)$')
    if not k then error('malformed key index ' .. meta .. ' ' .. stream .. ': ' .. state) end
    X.k, X.s, X.n, X.c = tonumber(k), tonumber(s), tonumber(n), tonumber(c)
  end
  of_shard[stream] = X
  return X
end

local function save_key_index(X)
  if X.n <= 0 then
    -- Empty: its buckets are gone (Redis deletes an empty hash), so it starts over.
    X.k, X.s, X.n, X.c, X.names = 0, 0, 0, 0, nil
    redis.call('HDEL', X.meta, X.stream)
  else
    redis.call('HSET', X.meta, X.stream, X.k .. ' ' .. X.s .. ' ' .. X.n .. ' ' .. X.c)
  end
end

-- The ids listed under key in X's stream (each once, oldest first), or an empty table.
local function key_ids(X, key)
  if X.n == 0 then return {} end
  local value = redis.call('HGET', record_bucket(X, record_hash(key)), key)
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

-- Lists ids under their keys in one stream's index: adds[i] = { key, id }, in order.
-- One HGET and one HSET per key the call names.
local function key_add_to(X, adds)
  local lists, order = grouped(#adds, function(i) return adds[i][1] end, function(i) return adds[i][2] end)
  -- Split first, so that the buckets have room (see hash_into).
  while X.n + #order > RECORD_LOAD * (2 ^ X.k + X.s) do split_bucket(X) end
  for _, key in ipairs(order) do
    local bucket = record_bucket(X, record_hash(key))
    local value = table.concat(lists[key], ' ')
    local old = redis.call('HGET', bucket, key)
    if old then value = old .. ' ' .. value else X.n = X.n + 1 end
    redis.call('HSET', bucket, key, value)
  end
  save_key_index(X)
end

-- Lists ids under their keys in a shard (by its bodies key): adds[i] = { key, stream,
-- id }, in order.
local function key_add(bodies, adds)
  local lists, streams = grouped(#adds, function(i) return adds[i][2] end,
    function(i) return { adds[i][1], adds[i][3] } end)
  for _, stream in ipairs(streams) do key_add_to(key_index_of(bodies, stream), lists[stream]) end
end

-- Takes id off key's list in X's stream (a message replaced under another key).
local function key_drop(X, key, id)
  if X.n == 0 then return end
  local bucket = record_bucket(X, record_hash(key))
  local value = redis.call('HGET', bucket, key)
  if not value then return end
  local kept = {}
  for other in string.gmatch(value, '%S+') do
    if other ~= id then kept[#kept + 1] = other end
  end
  if #kept == 0 then
    redis.call('HDEL', bucket, key)
    X.n = X.n - 1
  else
    redis.call('HSET', bucket, key, table.concat(kept, ' '))
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

-- Looks at up to `buckets` buckets of one stream's index (a stream picked at random
-- among the shard's, so that each is looked at in turn on average) from its cursor on,
-- keeping the ids still pending or on record (the shard's due set and bodies, its
-- records) and dropping the rest (and a key's field once it lists none). Returns the
-- ids dropped.
local function key_prune(due, bodies, records, buckets)
  local stream = redis.call('HRANDFIELD', bodies .. ':keys')
  if not stream then return 0 end
  local X = key_index_of(bodies, stream)
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
