-- trim.lua: forget terminal records whose retention has passed.
-- KEYS[1] records   KEYS[2] records by expiry   KEYS[3] fence
-- ARGV[1] epoch of the leader calling
-- ARGV[2] how many record ids to look at in this call, about (a batch's entry is taken whole)
-- returns: { records forgotten, record ids looked at } | error "FENCED ..."
-- An expiry entry lists the ids recorded at one instant (see the prelude); an id whose
-- record is gone, or was written again at another instant, is left alone.
local held = fenced(KEYS[3], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end

local budget = tonumber(ARGV[2])
local entries = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms(), 'LIMIT', 0, budget)
local forgotten, looked, done = 0, 0, {}
for _, entry in ipairs(entries) do
  if looked >= budget then break end
  local bar = string.find(entry, '|', 1, true)
  if not bar then
    -- The older layout: the entry is the id itself.
    forgotten = forgotten + redis.call('HDEL', KEYS[1], entry)
    looked = looked + 1
  else
    local at = string.sub(entry, 1, bar - 1)
    local ids = {}
    for id in string.gmatch(string.sub(entry, bar + 1), '[^\n]+') do ids[#ids + 1] = id end
    local recs = chunked({ 'HMGET', KEYS[1] }, ids)
    local gone = {}
    for i, id in ipairs(ids) do
      if recs[i] and string.match(recs[i], '^[^\n]*\n[^\n]*\n([^\n]*)') == at then gone[#gone + 1] = id end
    end
    forgotten = forgotten + chunked({ 'HDEL', KEYS[1] }, gone)
    looked = looked + #ids
  end
  done[#done + 1] = entry
end
chunked({ 'ZREM', KEYS[2] }, done)
return { forgotten, looked }
