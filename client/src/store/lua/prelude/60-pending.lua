-- 60-pending.lua: pending messages in their two layouts, found, added and removed.
-- Gives pending_of, pending_find, pending_remove, pending_add, pending_add_one,
-- pending_add_apart, pending_first, index_entry, save_index,
-- buckets_due, buckets_consume and their helpers.

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
--   B:ix:<b>   hash, id -> score, small enough for Redis's listpack encoding, for
--              every message in the compact layout but those whose id names their
--              score (placed_score): such a message is found from its id alone
-- Lua compares strings with strcoll (Redis sets LC_COLLATE from its environment), so
-- elements are never compared as strings: by score, then by id byte by byte.
local PENDING_BUCKET = 128

-- The index starts with 2^INDEX_MIN_K buckets, not one: linear hashing re-hashes a
-- bucket's ids each time one splits (about 1.5 SHA-1s and a move a new entry while
-- it grows), and growth costs most while the index is small. A bucket is a hash that
-- Redis makes with its first entry and deletes with its last, so an index of few
-- entries costs a small hash an entry, at most 2^INDEX_MIN_K of them a shard; from
-- about RECORD_LOAD * 2^INDEX_MIN_K entries on, it has the buckets its entries need,
-- as before. An index written with fewer buckets keeps its own count (the meta says
-- it): the minimum applies when an index starts.
local INDEX_MIN_K = 7

-- A score as 7 bytes, big-endian. The last score's bytes are kept between calls (they
-- depend on nothing else): a call's messages often share a due time. (In a block: a
-- script's chunk may hold at most 200 locals at once, prelude included.)
local score_bytes
do
  local last_score, last_bytes
  score_bytes = function(s)
    if s == last_score then return last_bytes end
    local v = s
    local b7 = v % 256
    v = (v - b7) / 256
    local b6 = v % 256
    v = (v - b6) / 256
    local b5 = v % 256
    v = (v - b5) / 256
    local b4 = v % 256
    v = (v - b4) / 256
    local b3 = v % 256
    v = (v - b3) / 256
    local b2 = v % 256
    last_score, last_bytes = s, string.char(((v - b2) / 256) % 256, b2, b3, b4, b5, b6, b7)
    return last_bytes
  end
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

-- A message table as its compact element: score, id and compact body, made in one
-- piece (see compact_body); an element already made (a string) as it is.
local function compact_elem(score, id, msg)
  if type(msg) == 'string' then return msg end
  return compact_body(msg, score_bytes(score), string.char(#id), id)
end

-- Whether id a sorts before id b, byte by byte. Ids that sort near each other share
-- long prefixes (a ULID's first ten characters are its time), so they are read eight
-- bytes at a time: one call into C a string per eight bytes, not per byte.
local function id_less(a, b)
  if a == b then return false end
  local n = math.min(#a, #b)
  for i = 1, n, 8 do
    local j = math.min(i + 7, n)
    local a1, a2, a3, a4, a5, a6, a7, a8 = string.byte(a, i, j)
    local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(b, i, j)
    if a1 ~= b1 then return a1 < b1 end
    if a2 ~= b2 then return a2 < b2 end
    if a3 ~= b3 then return a3 < b3 end
    if a4 ~= b4 then return a4 < b4 end
    if a5 ~= b5 then return a5 < b5 end
    if a6 ~= b6 then return a6 < b6 end
    if a7 ~= b7 then return a7 < b7 end
    if a8 ~= b8 then return a8 < b8 end
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
-- records (optional): the shard's records key, for a caller that will look records
-- up: whether the hash layouts hold anything is then asked of both in one EXISTS
-- (as a rule neither does; find_record asks no more).
local pending_states = {}
local function pending_of(due, bodies, records)
  local P = pending_states[due]
  if P then return P end
  local hashed, all = 0, nil
  if records and hash_layout_in_use[records] == nil then all = redis.call('EXISTS', due, bodies, records) end
  if all ~= 0 then hashed = redis.call('EXISTS', due, bodies) end
  if all then hash_layout_in_use[records] = all > hashed end
  local ix = { key = bodies .. ':ix', k = INDEX_MIN_K, s = 0, n = 0 }
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
  P = { due = due, bodies = bodies, q = due .. ':q', ix = ix, entered = {}, hashed = hashed > 0 }
  pending_states[due] = P
  return P
end

local function save_index(P)
  local ix = P.ix
  ix.split = nil
  if ix.n <= 0 then
    -- Empty: its buckets are gone (Redis deletes an empty hash), so it starts over.
    ix.k, ix.s, ix.n, ix.names = INDEX_MIN_K, 0, 0, nil
    redis.call('DEL', ix.key)
  else
    redis.call('SET', ix.key, ix.k .. ' ' .. ix.s .. ' ' .. ix.n)
  end
end

-- The score an id names, or nil: "d", the score in 12 hex digits, then 16 more
-- characters (MessageId::placed, the ids the daemon makes). Any id of that shape
-- names a score, whoever made it; what counts is whether its message has that score.
local function placed_score(id)
  if #id ~= 29 or string.byte(id, 1) ~= 100 then return nil end
  local hex = string.match(id, '^d(%x%x%x%x%x%x%x%x%x%x%x%x)')
  return hex and tonumber(hex, 16)
end

-- Adds ids[i] -> scores[i] to the index (none of them in it yet), counting them in n;
-- an id that names its score gets no entry, and one index_entry.enter took in during
-- the call (P.entered) has its entry and its count already.
local function index_put(P, ids, scores)
  local ix, taken_in, writing, values = P.ix, P.entered, {}, {}
  local adding = 0
  for i, id in ipairs(ids) do
    if not taken_in[id] then
      adding = adding + 1
      if placed_score(id) ~= scores[i] then writing[#writing + 1], values[#values + 1] = id, int_text(scores[i]) end
    end
  end
  -- The buckets split by the messages counted, so that they keep room for entries.
  while ix.n + adding > RECORD_LOAD * (2 ^ ix.k + ix.s) do split_bucket(ix) end
  send_by_bucket(ix, 'HSET', writing, values)
  ix.n = ix.n + adding
  save_index(P)
end

-- Takes ids (each in the compact layout, at scores[id]) out of the index.
local function index_del(P, ids, scores)
  local entered = {}
  for _, id in ipairs(ids) do
    if placed_score(id) ~= scores[id] then entered[#entered + 1] = id end
  end
  send_by_bucket(P.ix, 'HDEL', entered)
  P.ix.n = P.ix.n - #ids
  save_index(P)
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

-- Stores one message (its table; not yet in the compact layout) that does not sort
-- after the tail (pending_add appends those) in its bucket, splitting a bucket that
-- grows past PENDING_BUCKET in two. The index is the caller's (index_put).
local function bucket_insert(P, score, id, msg)
  local elem = compact_elem(score, id, msg)
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
    if len > PENDING_BUCKET and not redis.call('ZRANGEBYLEX', P.q, '(' .. floor, '+', 'LIMIT', 0, 1)[1] then
      -- After every message, in a full last bucket: it starts a new last bucket, as
      -- the tail's appends do (bucket_start), rather than split the full one in
      -- halves (messages that come one a shard a call would keep buckets half full).
      redis.call('LTRIM', key, 0, -2)
      floor = score_bytes(score) .. id
      redis.call('ZADD', P.q, 0, floor)
      key = bucket_key(P, floor)
      len = redis.call('RPUSH', key, elem)
    end
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

-- The index's entries, one id at a time (in one table: a script's chunk may hold at
-- most 200 locals at once, prelude included).
local index_entry = {
  -- The score of id's index entry, or nil (an id that names its score has none).
  get = function(P, id)
    if P.ix.n == 0 then return nil end
    local score = redis.call('HGET', record_bucket(P.ix, record_hash(id)), id)
    return score and tonumber(score)
  end,

  -- A push's index lookup and its entry in one command: enters id -> score unless
  -- the index has id already, and counts it in n. Returns true when it entered id,
  -- the score of the entry the index has, or nil for an id that names its score (no
  -- entry: look it up as pending_find does). The buckets split after the entry
  -- goes in, as they would before it (a bucket not yet split holds about twice the
  -- average, far below Redis's listpack limit), and only for an entry that went in;
  -- P.ix.split tells that the meta must be saved, stored message or not. P.entered
  -- is the set of ids entered so far in the call: index_put counts them as in, and
  -- one whose message is then not stored is taken back (take_back) within the call.
  enter = function(P, id, score)
    if placed_score(id) == score then return nil end
    local ix = P.ix
    local bucket = record_bucket(ix, record_hash(id))
    if redis.call('HSETNX', bucket, id, int_text(score)) == 0 then return tonumber(redis.call('HGET', bucket, id)) end
    ix.n = ix.n + 1
    P.entered[id] = true
    while ix.n > RECORD_LOAD * (2 ^ ix.k + ix.s) do
      split_bucket(ix)
      ix.split = true
    end
    return true
  end,

  take_back = function(P, id)
    redis.call('HDEL', record_bucket(P.ix, record_hash(id)), id)
    P.ix.n = P.ix.n - 1
    P.entered[id] = nil
  end,
}

-- Where a scheduled id is: { layout = 'compact', score, body, name, key, elem }
-- | { layout = 'hash', score (nil while held), body (nil: scheduled without one) } | nil.
-- Read a body with decode_body(where.body, where.score): a compact one has no due time.
-- indexed: the id's score in the index, or false, if the caller has asked it already.
local function pending_find(P, id, indexed)
  local score = indexed
  if score == nil then score = index_entry.get(P, id) end
  local name, key, elem
  if score then
    name, key, elem = bucket_find(P, id, score)
    if not name then error('pending index names ' .. id .. ' at ' .. score .. ' but no bucket has it') end
  else
    -- No entry: an id that names its score is asked of the bucket it names.
    score = P.ix.n > 0 and placed_score(id)
    if score then name, key, elem = bucket_find(P, id, score) end
  end
  if name then
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
    index_del(P, { id }, { [id] = where.score })
  else
    redis.call('ZREM', P.due, id)
    redis.call('HDEL', P.bodies, id)
  end
end

-- Stores messages (none of them pending) in the layout named: ids[i], scores[i],
-- msgs[i] (message tables, the schema's names; in the compact layout, a message's
-- element already made, a string, too); those index_entry.enter took in have their
-- index entries already.
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
        elems[#elems + 1] = compact_elem(scores[i], ids[i], msgs[i])
        tail.score, tail.id = scores[i], ids[i]
        i = i + 1
      end
      tail.len = redis.call('RPUSH', tail.list, unpack(elems))
    else
      bucket_insert(P, scores[i], ids[i], msgs[i])
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
-- the caller used), and their ids out of the index (scores: id -> its score). lens:
-- the lengths buckets_due found (a bucket not in it is asked).
local function buckets_consume(P, taken, names, ids, scores, lens)
  P.tail = nil
  for key, count in pairs(taken) do
    if (lens[key] or redis.call('LLEN', key)) <= count then
      redis.call('DEL', key)
      redis.call('ZREM', P.q, names[key])
    else
      redis.call('LTRIM', key, count, -1)
    end
  end
  if #ids > 0 then index_del(P, ids, scores) end
end
