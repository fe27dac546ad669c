-- clear_switchover.lua: end a switchover to one node, and only to it.
-- KEYS[1] the switchover key
-- ARGV[1] the node it must name
-- returns: 1 if the key named ARGV[1] and is deleted, else 0 (a request made
-- in between for another node stays)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
