#!/usr/bin/env python3
"""Redis memory of a business key: bytes per pending message with a key and without.

    python3 bench/key_memory.py [MESSAGES] [ROUNDS] [STREAM]

Loads the working tree's prelude and schedule_batch.lua as a library of Redis
Functions in one redis-server of its own (a free loopback port, removed at the
end; a new one for each fill). Each round stores MESSAGES (default 100,000) 100-byte messages to STREAM
(default "orders"), ids `m<i>`, due a day ahead, in calls of 1000 over 16 shards
(each id's shard from a hash of it, as delayq spreads ids): once without keys, once
with one key for each three messages (`k<i/3>`, so a key's messages sit in up to
three shards). Each fill has a redis-server of its own. Prints, for
each, `used_memory` after the fill less before it per message, and for the keyed
fill the key index's own bytes (the sum of `MEMORY USAGE` of its hashes) per
message. ROUNDS (default 2) repeats both.

Only Python's standard library; no delayq process is involved.
"""

import os
import sys
import zlib

import script_cost as sc
from kept_apart import used_memory

SHARDS = 16


def fill(r, keys, n, stream, keyed):
    """Stores n messages over the shards of `keys`."""
    commands = []
    for start in range(0, n, 1000):
        msgs = []
        for i in range(start, min(start + 1000, n)):
            mid = "m%d" % i
            m = sc.message(zlib.crc32(mid.encode()) % SHARDS + 1)
            m[3], m[4], m[5] = mid, "in", str(86_400_000)
            m[8], m[9] = ("k%d" % (i // 3) if keyed else ""), stream
            msgs.append(m)
        commands.append(sc.encode("FCALL", "push", len(keys), *keys, *sc.push_args(msgs)))
    sc.pushed(r, commands)


def index_bytes(r):
    """The key indexes' bytes: every shard's `…:msg:keys` hash and its buckets."""
    total, cursor = 0, b"0"
    while True:
        cursor, names = r.call("SCAN", cursor, "MATCH", "*:msg:keys*", "COUNT", "1000")
        for name in names:
            total += r.call("MEMORY", "USAGE", name, "SAMPLES", "0") or 0
        if cursor == b"0":
            return total


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    stream = sys.argv[3] if len(sys.argv) > 3 else "orders"
    prelude = sc.prelude_text()
    schedule = open(os.path.join(sc.LUA, "schedule_batch.lua")).read()
    keys = [k for s in range(SHARDS) for k in sc.shard_keys("b", s)]

    def fill_one(keyed, got):
        def run(r):
            sc.load_library(r, "delayq_keys", prelude, {"push": schedule})
            before = used_memory(r)
            fill(r, keys, n, stream, keyed)
            got[keyed] = ((used_memory(r) - before) / n, index_bytes(r) / n)
        sc.with_redis(run)

    print("%d messages to %r, 16 shards, bytes a pending message:" % (n, stream))
    for round_ in range(1, rounds + 1):
        got = {}
        for keyed in (False, True):
            fill_one(keyed, got)
        print("  round %d: no key %.1f B, keyed %.1f B: a key adds %+.1f B (its index %.1f B)"
              % (round_, got[False][0], got[True][0], got[True][0] - got[False][0],
                 got[True][1]))

if __name__ == "__main__":
    main()
