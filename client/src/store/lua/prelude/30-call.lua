-- 30-call.lua: what every call starts with: its new messages read from ARGV, Redis's
-- clock, the fence check, due times resolved against now. Gives read_new_message,
-- now_ms_us, now_ms, call_epoch, fenced, fenced_reply, resolve_due.

-- One new message from a schedule call's arguments, starting at argv[i]: id, due
-- value, key ("" = none) and its field/value pairs packed as the body holds them (one
-- MessagePack array of strings; the layout NewMessage::script_args writes); the rest
-- from its context, what it shares with others of its call (due kind, priority, ttl
-- ms, stream; SharedArgs). Returns the id, the due value, the message as it will be
-- stored (the schema's names, its fields as packed_fields, which encode_body splices
-- in; new_msg sets the rest), and the index after it.
local function read_new_message(argv, i, context)
  local key = argv[i + 2]
  if key == '' then key = nil end
  -- Every name new_msg sets is named here too, so that the table is sized once.
  local msg = { stream = context.stream, packed_fields = argv[i + 3], priority = context.priority, key = key,
    due = nil, created = nil, attempt = nil, expire_at = nil }
  return argv[i], argv[i + 1], msg, i + 4
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

-- The epoch of the call, as fenced() took it ([1]; 0 or nil: a producer's call), so
-- that what the call writes to the journal's outbox names the term that made it.
local call_epoch = {}

-- Checks the caller's fence epoch against the shard's. Epoch 0 is a producer
-- (schedule, cancel, reschedule from any instance) and is never fenced.
-- Returns nil when the caller may go on, or the epoch Redis holds when it may not.
local function fenced(fence_key, epoch)
  epoch = tonumber(epoch)
  call_epoch[1] = epoch
  if epoch == 0 then return nil end
  local held = tonumber(redis.call('GET', fence_key) or '0')
  if held > epoch then return held end
  if epoch > held then redis.call('SET', fence_key, epoch) end
  return nil
end

local function fenced_reply(held, epoch)
  return redis.error_reply('FENCED epoch ' .. epoch .. ' is below the fence ' .. held)
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
