-- 20-body.lua: a stored message's body and fields. Gives body_fields (the schema),
-- decode_body, encode_body, body_stream, compact_body, new_body, full_body,
-- body_values and split_own_fields.
--
-- Message body (a shard's bodies hash, field = id): a cmsgpack array, laid out by
--   body_fields below, the one place that says which position holds which field.
--   Scripts read and write bodies only through decode_body and encode_body, by name.

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
    key = b[11],            -- the producer's business key (see 80-keys.lua), nil if none
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

-- The schema's names by position, and the fields' position, read off it once per
-- call that needs them: the schema applied to a probe whose elements are their own
-- positions (a body has far fewer than 64). (Its state, like encode_body's below, in
-- a block: a script's chunk may hold at most 200 locals at once, prelude included,
-- and forward.lua as EVAL is near that.)
local body_layout
do
  local names, fields_at
  body_layout = function()
    if not names then
      local probe = {}
      for i = 1, 64 do probe[i] = i end
      names = {}
      for name, i in pairs(body_fields(probe)) do names[i] = name end
      fields_at = body_fields(probe).fields
    end
    return names, fields_at
  end
end

-- A message table (the schema's names) as a body. Optional fields not set at the end
-- are left out of the body, so it is exactly as long as the message needs; one not set
-- before a field that is set is written as false, so the body stays an array. A new
-- message's fields come packed already (packed_fields, see read_new_message): the
-- body is then the other elements packed around them, the same bytes
-- cmsgpack.pack makes of the whole.
local encode_body
do
  -- Packers of body[from .. to] as MessagePack (one value after another, no array
  -- around them), each keeping the values it packed last and their bytes between
  -- calls: before a new message's fields come the format and its stream, after them
  -- its due time (false in the compact layout), priority, when it was created (the
  -- call's clock), attempt and expiry, which a call's messages mostly share, and
  -- packing them is most of what such a body costs.
  local function packer()
    local last, last_n, last_text = {}, 0, ''
    return function(body, from, to)
      local n = to - from + 1
      if n <= 0 then return '' end
      if n == last_n then
        local same = true
        for j = 1, n do
          if last[j] ~= body[from + j - 1] then
            same = false
            break
          end
        end
        if same then return last_text end
      end
      last_n, last_text = n, cmsgpack.pack(unpack(body, from, to))
      for j = 1, n do last[j] = body[from + j - 1] end
      return last_text
    end
  end
  local pack_head, pack_tail = packer(), packer()
  -- The elements before and after a packed message's fields, reused by every call
  -- (the packers copy what they keep).
  local head, tail = {}, {}

  -- A packed message's body: no array of the whole is built, and the body is made
  -- in one concatenation, after `score` (7 bytes), `id_len` and `id` when given (a
  -- compact element, compact_elem's bytes).
  local function encode_packed(msg, names, fields_at, score, id_len, id)
    local last = fields_at
    for i = #names, fields_at + 1, -1 do
      if msg[names[i]] ~= nil then
        last = i
        break
      end
    end
    -- An array of at most 15 elements: its length in its first byte.
    if last > 15 then error('a body of ' .. last .. ' elements') end
    head[1] = BODY_FORMAT
    for i = 2, fields_at - 1 do
      local value = msg[names[i]]
      if value == nil then value = false end
      head[i] = value
    end
    for i = fields_at + 1, last do
      local value = msg[names[i]]
      if value == nil then value = false end
      tail[i - fields_at] = value
    end
    local h, t = pack_head(head, 1, fields_at - 1), pack_tail(tail, 1, last - fields_at)
    if score then
      return score .. id_len .. id .. string.char(0x90 + last) .. h .. msg.packed_fields .. t
    end
    return string.char(0x90 + last) .. h .. msg.packed_fields .. t
  end

  encode_body = function(msg, score, id_len, id)
    local names, fields_at = body_layout()
    if msg.packed_fields then return encode_packed(msg, names, fields_at, score, id_len, id) end
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
    local raw = cmsgpack.pack(body)
    if score then return score .. id_len .. id .. raw end
    return raw
  end
end

-- A message table as the compact pending layout stores it: its due time left out
-- (false; 8 bytes less), as the element's score says it. Given score (its 7 bytes),
-- id_len and id, the element itself (compact_elem's bytes), made in one piece.
-- A new message as a push stores it (its fields packed, attempt 1, an expiry, no
-- key, never delivered: the schema's elements up to expire_at, eight) is made from
-- two parts a call's messages mostly share, each packed again only when it changes:
-- before its fields the format and its stream, after them its due time (false),
-- priority, created, attempt and expiry. The same bytes as encode_body's
-- (store::packed_bodies checks both in Redis), without its walk of the schema.
-- new_body: the same of a new message given as its values (no table), which a push
-- stores most messages as.
local compact_body, new_body
do
  local stream, head, priority, created, expire_at, tail
  new_body = function(s, packed, p, c, e, score, id_len, id)
    if s ~= stream then stream, head = s, cmsgpack.pack(BODY_FORMAT, s) end
    if p ~= priority or c ~= created or e ~= expire_at then
      priority, created, expire_at = p, c, e
      tail = cmsgpack.pack(false, p, c, 1, e)
    end
    -- '\152': an array of eight elements.
    if score then return score .. id_len .. id .. '\152' .. head .. packed .. tail end
    return '\152' .. head .. packed .. tail
  end
  compact_body = function(msg, score, id_len, id)
    if msg.packed_fields and msg.attempt == 1 and msg.expire_at and msg.key == nil
        and msg.first_delivered == nil and msg.reason == nil then
      return new_body(msg.stream, msg.packed_fields, msg.priority, msg.created, msg.expire_at, score, id_len, id)
    end
    local due = msg.due
    msg.due = nil
    local raw = encode_body(msg, score, id_len, id)
    msg.due = due
    return raw
  end
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
