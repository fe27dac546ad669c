-- forward.lua: move up to a batch of due messages from one shard into their streams,
-- atomically, so a crash can neither lose nor duplicate a forward.
-- KEYS[1] due set   KEYS[2] bodies   KEYS[3] records   KEYS[4] records by expiry   KEYS[5] fence
-- ARGV[1] epoch of the leader calling
-- ARGV[2] batch size
-- ARGV[3] how long to keep delivery records, ms
-- ARGV[4] name of the id field added to each entry ("" = none)
-- ARGV[5] name of the attempt field added to each entry ("" = none)
-- ARGV[6] suffix of a stream's dead-letter stream (e.g. ":dead")
-- ARGV[7] stream for messages that cannot be read or written at all
-- ARGV[8] default MAXLEN ~ for target streams (0 = none)
-- ARGV[9..] stream, maxlen, stream, maxlen, ...: per-stream MAXLEN ~ overrides
-- returns: { forwarded, expired, dead, next_due_ms (-1 = none), now_ms,
--            { lateness_ms, ... },  { stream, count, stream, count, ... } }
--        | error "FENCED ..."
-- Streams are written by name, not through KEYS: on Redis Cluster they live in other
-- slots, and forwarding there takes the claim/confirm path instead of this script.
local held = fenced(KEYS[5], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now * 10 + 9, 'LIMIT', 0, tonumber(ARGV[2]))
local id_field, attempt_field, dead_suffix = ARGV[4], ARGV[5], ARGV[6]
local keep_until = now + tonumber(ARGV[3])

local maxlens = {}
for i = 9, #ARGV, 2 do maxlens[ARGV[i]] = tonumber(ARGV[i + 1]) end
local default_maxlen = tonumber(ARGV[8])

-- XADD through pcall: a script error is not rolled back, so one bad target (a key
-- that is not a stream) must not abort the batch after earlier entries were written.
-- returns: entry id, or nil and the error text
local function xadd(stream, fields, extra)
  local args = { 'XADD', stream }
  local maxlen = maxlens[stream] or default_maxlen
  if maxlen > 0 then
    args[3] = 'MAXLEN'; args[4] = '~'; args[5] = maxlen
  end
  args[#args + 1] = '*'
  for i = 1, #fields do args[#args + 1] = fields[i] end
  for i = 1, #extra do args[#args + 1] = extra[i] end
  local res = redis.pcall(unpack(args))
  if type(res) == 'table' and res.err then return nil, res.err end
  return res, nil
end

-- Last resort for a message that cannot reach its stream or its dead-letter stream.
local function unreadable(id, why, body)
  local res = redis.pcall('XADD', ARGV[7], '*', 'delayq-id', id, 'delayq-reason', why, 'delayq-body', body)
  if type(res) == 'table' and res.err then return '' end
  return res
end

local forwarded, expired, dead = 0, 0, 0
local lateness, per_stream, per_stream_order = {}, {}, {}
local record_args = {}
local expiry_args = {}

local bodies = {}
if #ids > 0 then bodies = redis.call('HMGET', KEYS[2], unpack(ids)) end

for i, id in ipairs(ids) do
  local body = bodies[i]
  local rec
  if body then
    local m, why = decode_body(body)
    if not m then
      rec = record('dead', unreadable(id, why, body), now, 0, ARGV[7])
      dead = dead + 1
    else
      local stream, attempt = m[2], m[7]
      local extra = {}
      if id_field ~= '' then extra[#extra + 1] = id_field; extra[#extra + 1] = id end
      if attempt_field ~= '' then extra[#extra + 1] = attempt_field; extra[#extra + 1] = attempt end
      local entry, err
      if m[8] > 0 and now > m[8] then
        local dead_stream = stream .. dead_suffix
        extra[#extra + 1] = 'delayq-reason'; extra[#extra + 1] = 'expired'
        extra[#extra + 1] = 'delayq-due'; extra[#extra + 1] = m[4]
        entry, err = xadd(dead_stream, m[3], extra)
        if entry then
          rec = record('expired', entry, now, attempt, dead_stream)
          expired = expired + 1
        end
      else
        entry, err = xadd(stream, m[3], extra)
        if entry then
          -- A delivery's time is its entry id's; a redelivered message keeps the
          -- first one, for its dead letter.
          local first_delivered = tonumber(string.match(entry, '^(%d+)'))
          if type(m[9]) == 'number' and m[9] > 0 then first_delivered = m[9] end
          rec = record('delivered', entry, now, attempt, stream, first_delivered)
          forwarded = forwarded + 1
          lateness[#lateness + 1] = now - m[4]
          if not per_stream[stream] then
            per_stream[stream] = 0
            per_stream_order[#per_stream_order + 1] = stream
          end
          per_stream[stream] = per_stream[stream] + 1
        end
      end
      if not entry then
        rec = record('dead', unreadable(id, 'cannot write to ' .. stream .. ': ' .. err, body), now, attempt, ARGV[7])
        dead = dead + 1
      end
    end
    record_args[#record_args + 1] = id
    record_args[#record_args + 1] = rec
    expiry_args[#expiry_args + 1] = keep_until
    expiry_args[#expiry_args + 1] = id
  end
end

if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('HDEL', KEYS[2], unpack(ids))
end
if #record_args > 0 then
  redis.call('HSET', KEYS[3], unpack(record_args))
  redis.call('ZADD', KEYS[4], unpack(expiry_args))
end

local next_due = -1
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[1] then next_due = math.floor(tonumber(first[2]) / 10) end

local counts = {}
for _, stream in ipairs(per_stream_order) do
  counts[#counts + 1] = stream
  counts[#counts + 1] = per_stream[stream]
end
return { forwarded, expired, dead, next_due, now, lateness, counts }
