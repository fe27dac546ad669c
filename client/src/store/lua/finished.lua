-- finished.lua: one shard's finished messages of a stream, newest first (see
-- 35-finished.lua). Read-only.
-- KEYS[1] records
-- ARGV[1] stream
-- ARGV[2] the place to start at, walking toward older ids ("" = the newest)
-- ARGV[3] the latest finish time (ms) an id may show ("" = any): an id whose record is
--   newer than the ids listed after it finished again since (a replay), and was shown
--   where it finished last
-- ARGV[4] how many messages to answer at most
-- ARGV[5] the states wanted, space-separated ("" = every state)
-- ARGV[6] how many ids to look at, at most
-- returns: { next, last_at, id, state, at, entry, attempt, first_delivered, written_to,
--   place, late, ... }, nine values per message, newest first:
--   next: the place of the next id to look at, "" when the list's start was reached
--   last_at: the finish time of the last id shown or passed over ("" = none), for
--   ARGV[3] next
--   state: delivered | expired | dead | cancelled; at: when (ms); entry: the entry
--   written ("" if none); attempt; first_delivered: when attempt 1 reached the stream
--   ('' for attempt 1 itself); written_to: the stream written (a dead letter's is its
--   dead-letter stream); late: how long after its due time a delivered one was sent
--   ("" when not at all, or not on record)
local records, stream = KEYS[1], ARGV[1]
local list = finished.list(records, stream)
local popped = tonumber(redis.call('HGET', finished.streams(records), stream) or '0')
local length = redis.call('LLEN', list)
local place = popped + length - 1
if ARGV[2] ~= '' then place = math.min(place, tonumber(ARGV[2])) end
local ceiling = tonumber(ARGV[3] ~= '' and ARGV[3] or nil)
local limit, budget = tonumber(ARGV[4]), tonumber(ARGV[6])
local wanted = nil
if ARGV[5] ~= '' then
  wanted = {}
  for state in string.gmatch(ARGV[5], '%S+') do wanted[state] = true end
end

local out, found, seen = { '', '' }, 0, {}
local LOOK = 64
while place >= popped and found < limit and budget > 0 do
  local from = math.max(popped, place - LOOK + 1)
  local ids = redis.call('LRANGE', list, from - popped, place - popped)
  for i = #ids, 1, -1 do
    local id = ids[i]
    local rec = not seen[id] and find_record(records, id)
    seen[id] = true
    local at = rec and tonumber(rec.at)
    -- Delivered or cancelled to another stream: the id was pushed again since.
    if rec and (rec.state == 'delivered' or rec.state == 'cancelled') and rec.stream ~= stream then
      rec = nil
    end
    if rec and not (ceiling and at > ceiling) then
      ceiling = at
      out[2] = string.format('%d', at)
      if not wanted or wanted[rec.state] then
        found = found + 1
        local n = #out
        out[n + 1], out[n + 2], out[n + 3], out[n + 4] = id, rec.state, at, rec.entry
        out[n + 5], out[n + 6], out[n + 7], out[n + 8] = tostring(rec.attempt), rec.first_delivered,
          rec.stream, from + i - 1
        out[n + 9] = rec.late
      end
    end
    place = from + i - 2
    budget = budget - 1
    if found >= limit or budget <= 0 then break end
  end
end
if place >= popped then out[1] = string.format('%d', place) end
return out
