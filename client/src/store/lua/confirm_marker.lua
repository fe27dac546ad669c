-- confirm_marker.lua: make the journal's provisional marker final, if it is still
-- there (Redis kept its data since it was written).
-- KEYS[1] the journal marker key
-- ARGV[1] the provisional value, written before the journal was counted
-- ARGV[2] the marker's token
-- returns: 1 if the key held ARGV[1] and now holds ARGV[2]; 0 if it holds anything
-- else or nothing (a loss of Redis's data took the provisional value with it)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
