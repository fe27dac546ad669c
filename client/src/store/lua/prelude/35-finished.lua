-- 35-finished.lua: each stream's finished messages, newest last (records.finished_list).
-- Gives `finished`: finished.list, finished.streams and finished.add.
--
-- A shard lists, per target stream, the ids of its messages that reached a terminal
-- state (delivered, expired, dead, cancelled) while records are kept, so that a
-- stream's recent history can be read newest first without walking every record:
--   R:fin:<stream>  list of ids, in the order their records were written (an id again
--                   when it finished again, after a replay); what a message became is
--                   its record's to say (find_record), so an id whose record is gone
--                   is skipped when read, and trim pops such ids off the list's head.
--   R:fins          hash, stream -> how many ids trim has popped off the head of its
--                   list so far: the streams that have a list in this shard. An id's
--                   place, that count plus its index, stays the same while the list
--                   grows and shrinks, so that a page can say where the next starts.
-- R is the shard's records key. A record costs its id's length and a few bytes here;
-- with records.finished_list = false nothing is listed (see bench/records_memory.py).

-- A table of functions (a script's chunk may hold at most 200 locals, prelude
-- included), made whole here: the library empties only the caches, `local x = {}`.
local finished = {
  list = function(records, stream)
    return records .. ':fin:' .. stream
  end,
  streams = function(records)
    return records .. ':fins'
  end,
}

-- Lists ids[i] under its target stream: targets[i], else parts[i]'s stream (a record
-- names where it was written: a dead letter's, its dead-letter stream, so callers
-- that write those pass targets). One RPUSH per stream the call names.
function finished.add(records, ids, parts, targets)
  local lists, streams = grouped(#ids, function(i)
    local stream = (targets and targets[i]) or parts[i][5]
    if stream == '' then return nil end
    return stream
  end, function(i) return ids[i] end)
  for _, stream in ipairs(streams) do
    local list = lists[stream]
    local length = chunked({ 'RPUSH', finished.list(records, stream) }, list)
    -- One chunk's reply is the list's length: it was new if that is all it holds.
    if length == #list or #list > CHUNK then redis.call('HSETNX', finished.streams(records), stream, 0) end
  end
end
