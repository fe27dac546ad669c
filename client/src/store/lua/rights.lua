-- rights.lua: which of the commands delayq runs the connected user may not run, as
-- Redis's ACLs answer (redis.acl_check_cmd, Redis 7): nothing is read or written.
-- Not part of the library: it runs with EVAL, at start and after a reconnection.
-- KEYS: none (acl_check_cmd compares names with the user's rules; it touches no key)
-- ARGV: checks, each a command and its arguments followed by an empty string:
--   "XADD" "orders" "*" "f" "v" "" "PUBLISH" "delayq:wake" "x" "" ...
-- returns: {} when every check passes | { "cannot-tell" } before Redis 7
--        | each refused check as one text, "XADD orders * f v"
if not redis.acl_check_cmd then return { 'cannot-tell' } end
local refused, cmd = {}, {}
for i = 1, #ARGV do
  if ARGV[i] == '' then
    local ok, allowed = pcall(redis.acl_check_cmd, unpack(cmd))
    if not ok or not allowed then refused[#refused + 1] = table.concat(cmd, ' ') end
    cmd = {}
  else
    cmd[#cmd + 1] = ARGV[i]
  end
end
return refused
