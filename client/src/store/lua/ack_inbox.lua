-- ack_inbox.lua: acknowledge and delete inbox entries whose messages are stored, in one
-- atomic call. On Redis Cluster the inbox lives in another slot than the shards, so
-- schedule_batch.lua cannot do it in its own call: this runs right after it, and an
-- entry whose acknowledgement is lost is read again and found a duplicate.
-- KEYS[1] inbox stream
-- ARGV[1] inbox consumer group
-- ARGV[2..] entry ids
-- returns: entries acknowledged | error "WRONGTYPE ..." (nothing was changed)
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE inbox ' .. KEYS[1] .. ' is a ' .. kind .. ', not a stream')
end
if kind == 'none' then return 0 end
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
local acked = chunked({ 'XACK', KEYS[1], ARGV[1] }, ids)
inbox_entries.forget(KEYS[1], ARGV[1], ids)
return acked
