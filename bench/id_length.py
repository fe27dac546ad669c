#!/usr/bin/env python3
"""Redis time of the schedule script by the length of the message ids, side by side.

    python3 bench/id_length.py [PER_CALL] [ROUNDS]

Loads the working tree's prelude and schedule_batch.lua as a library of Redis
Functions in one redis-server of its own (a free loopback port, removed at the
end), then alternates rounds of 50 calls (which kind goes first alternates too,
as in script_ab.py):
one kind with 26-character ULIDs counting up within the call's millisecond (the
ids delayq makes for messages pushed without one), the other with short ids
`b<n>` counting up (the bench's). Each call carries PER_CALL (default 200) new
100-byte messages due in the call's own millisecond a day ahead; each kind has a
shard of its own, so that neither's messages land among the other's. Each round's
calls are pipelined after `CONFIG RESETSTAT` and its cost read from `INFO
commandstats`. Prints the median round of each kind (ROUNDS, default 20), per
message.

Only Python's standard library; no delayq process is involved.
"""

import os
import random
import statistics
import sys

import script_ab as ab
import script_cost as sc

CALLS = 50


def calls(kind, per_call, ms, serial):
    """CALLS encoded FCALLs of one kind; the next millisecond and serial."""
    keys = sc.shard_keys(kind, 0)
    out = []
    for _ in range(CALLS):
        ms += 1
        start = random.getrandbits(79)
        msgs = []
        for j in range(per_call):
            mid = ab.ulid(ms, start + j) if kind == "ulid" else "b%d" % (serial + j)
            m = sc.message(1)
            m[3], m[4], m[5] = mid, "at", str(ms + 86_400_000)
            msgs.append(m)
        serial += per_call
        out.append(sc.encode("FCALL", "push", len(keys), *keys, *sc.push_args(msgs)))
    return out, ms, serial


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    per_call = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    prelude = sc.prelude_text()
    schedule = open(os.path.join(sc.LUA, "schedule_batch.lua")).read()

    def work(r):
        sc.load_library(r, "id_length", prelude, {"push": schedule})
        cost = ab.alternated(r, ("ulid", "short"), rounds, per_call,
                             lambda kind, ms, serial: calls(kind, per_call, ms, serial))
        print("%d messages a call, ids counting up, median of %d rounds of %d calls:"
              % (per_call, rounds, CALLS))
        for kind, label in (("ulid", "26-character ULIDs"), ("short", "b<n>")):
            print("  %-20s %.1f µs of Redis a message" % (label, statistics.median(cost[kind])))

    sc.with_redis(work)


if __name__ == "__main__":
    main()
