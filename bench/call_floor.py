#!/usr/bin/env python3
"""What one script call costs Redis at least, called one at a time as spread traffic
calls it, beside what delayq's push costs.

    python3 bench/call_floor.py [calls] [rounds]

Starts a redis-server of its own on a free loopback port (removed at the end), loads
delayq's scripts as the daemon does (one library of Redis Functions: the prelude,
then each script as a function whose per-call caches start empty) and a library of
two floors, and sends each variant `calls` times (default 3000) one at a time with
1 ms between calls, then as many back to back (pipelined), `rounds` times side by
side (default 3). Reported: Redis's own µs per call (`INFO commandstats`, fcall),
each round's figure.

Variants, all with the same keys and arguments as a one-message push:
  empty function          FCALL of a function that returns at once
  delayq, returns at once delayq's schedule_batch returning before its first line
  least push              the least a checked push does: TIME, the id looked up in
                          an index bucket and a records bucket (HGET each), the
                          body packed and appended to a list, the index written
                          (HSET): five commands and almost no Lua
  delayq push             schedule_batch.lua storing the message (compact layouts)

The first three bound from below what any script call of a push costs on this
machine; the last is what it costs now.

Only Python's standard library; no delayq process is involved.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import script_cost as sc  # noqa: E402

LUA = sc.LUA
SCRIPTS = ["schedule_batch"]

FLOORS = """#!lua name=floors
redis.register_function('empty', function(KEYS, ARGV) return 1 end)
redis.register_function('least_push', function(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  -- The arguments as delayq's push takes them (script_cost.push_args): one context
  -- (ARGV[9..14], its stream last), then one message (ARGV[15..19]).
  local id = ARGV[16]
  local h = tonumber(string.sub(redis.sha1hex(id), 1, 8), 16) % 4
  if redis.call('HGET', KEYS[2] .. ':ix:' .. h, id) then return { 'duplicate' } end
  if redis.call('HGET', KEYS[3] .. ':g:' .. h, id) then return { 'duplicate' } end
  local due = now + tonumber(ARGV[17])
  local body = '\\152' .. cmsgpack.pack(1, ARGV[14]) .. ARGV[19] .. cmsgpack.pack(false, 0, now, 1, 0)
  redis.call('RPUSH', KEYS[1] .. ':q:last', body)
  redis.call('HSET', KEYS[2] .. ':ix:' .. h, id, due * 10 + 9)
  return { 'scheduled', due, '' }
end)
"""


def delayq_library(name, at_once):
    """delayq's library as the daemon loads it; with `at_once`, each function
    returns before its script's first line."""
    caches = sc.CACHES
    prelude = sc.prelude_text()
    text = "#!lua name=%s\n%s\nlocal function fresh()\n  %s = %s\nend\n" % (
        name, prelude, ", ".join(caches), ", ".join(["{}"] * len(caches)))
    for script in SCRIPTS:
        body = open(os.path.join(LUA, script + ".lua")).read()
        head = "do return 1 end\n" if at_once else ""
        text += ("redis.register_function('%s_%s', function(KEYS, ARGV)\nfresh()\n%s%s\nend)\n"
                 % (name, script, head, body))
    return text


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    sc.with_redis(lambda r: run(r, calls, rounds))


def run(r, calls, rounds):
    r.call("FUNCTION", "LOAD", "REPLACE", FLOORS)
    r.call("FUNCTION", "LOAD", "REPLACE", delayq_library("at_once", True))
    r.call("FUNCTION", "LOAD", "REPLACE", delayq_library("delayq", False))
    variants = [("empty function", "empty"),
                ("delayq, returns at once", "at_once_schedule_batch"),
                ("least push", "least_push"),
                ("delayq push", "delayq_schedule_batch")]

    def check(function, reply):
        if reply != 1 and not sc.stored(reply):
            sys.exit("%s: unexpected reply %r" % (function, reply))

    def command(function, i):
        keys = sc.shard_keys("floor", i % 16)
        return sc.encode("FCALL", function, len(keys), *keys, *sc.push_args([sc.message(1)]))

    def paced(function):
        r.call("CONFIG", "RESETSTAT")
        for i in range(calls):
            r.sock.sendall(command(function, i))
            check(function, r.read())
            time.sleep(0.001)
        return sc.commandstats_usec(r)["fcall"] / calls

    def back_to_back(function):
        r.call("CONFIG", "RESETSTAT")
        r.sock.sendall(b"".join(command(function, i) for i in range(calls)))
        for _ in range(calls):
            check(function, r.read())
        return sc.commandstats_usec(r)["fcall"] / calls

    figures = {(label, way): [] for label, _ in variants for way in (paced, back_to_back)}
    for _ in range(rounds):
        for label, function in variants:
            for way in (paced, back_to_back):
                figures[(label, way)].append(way(function))
    print("| variant | one call every ~1 ms: Redis µs per call, each round | back to back |")
    print("|---|---|---|")
    for label, _ in variants:
        print("| %s | %s | %s |" % (label, *(" · ".join("%.1f" % f for f in figures[(label, way)])
                                           for way in (paced, back_to_back))))


if __name__ == "__main__":
    main()
