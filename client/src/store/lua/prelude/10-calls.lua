-- 10-calls.lua: Redis commands built from lists of any length, lists grouped for
-- them, integers as a command's text, and which failed writes are a message's own
-- fault. Gives chunked, CHUNK, grouped, int_text, MAX_FIELD_VALUES, own_fault.

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

-- Items 1..n grouped by a name, in first-seen order: lists[name] = { value(i), ... }
-- for each i whose name(i) is not nil, and the names in order.
local function grouped(n, name, value)
  local lists, order = {}, {}
  for i = 1, n do
    local of = name(i)
    if of ~= nil then
      local list = lists[of]
      if not list then
        list = {}
        lists[of] = list
        order[#order + 1] = of
      end
      list[#list + 1] = value(i)
    end
  end
  return lists, order
end

-- An integer as the text a command takes. A number handed to redis.call as it is
-- becomes text through Redis's "%.17g": a command given a score's 14 digits took
-- about 0.5 µs more than one given their text, a small number about 0.3 more (one
-- EVAL on Redis 7.0). "%d" makes the same digits for every integer a double holds
-- exactly, in about 0.25 µs, and the last one's text is kept (a call's messages
-- mostly share a score, an attempt). Anything but a nonzero integer a double holds
-- exactly (a fraction, -0, a string from a malformed body) is handed back as it is,
-- for Redis to take as before.
local int_text
do
  local last, last_text = 1, '1'
  int_text = function(n)
    if n ~= last then
      if type(n) ~= 'number' or n % 1 ~= 0 or n == 0 or n >= 2 ^ 53 or n <= -2 ^ 53 then return n end
      last, last_text = n, string.format('%d', n)
    end
    return last_text
  end
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
