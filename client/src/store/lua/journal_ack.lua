-- journal_ack.lua: the leader copied a shard's first outbox items into the journal
-- (a journal write is idempotent); they are dropped from the outbox. Fenced, so that
-- a deposed leader cannot drop items the new leader has not copied yet.
-- KEYS[1] the shard's journal outbox   KEYS[2] fence
-- ARGV[1] epoch
-- ARGV[2] how many items, from the head, were copied
-- returns: the items left | error "FENCED ..."
local held = fenced(KEYS[2], ARGV[1])
if held then return fenced_reply(held, ARGV[1]) end
redis.call('LTRIM', KEYS[1], tonumber(ARGV[2]), -1)
return redis.call('LLEN', KEYS[1])
