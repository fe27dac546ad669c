#!/usr/bin/env python3
"""Redis memory of a delivery record, with each stream's finished list and without.

    python3 bench/records_memory.py [MESSAGES] [ROUNDS]

Loads the working tree's prelude, schedule_batch.lua and forward.lua as a library of
Redis Functions in a redis-server of its own for each run (a free loopback port,
removed at the end). Each run stores MESSAGES (default 100,000) 100-byte messages,
ids `m<i>`, due at once in one shard, forwards them in calls of 200 with records
kept a day (the compact layout), deletes the stream they went to and prints what
Redis holds beyond what it held before the messages, per message: the records, and
with `records.finished_list` on (the default) the finished list; and Redis's CPU
time of the forward calls per message. ROUNDS (default 2) repeats both, which goes
first alternating.

Only Python's standard library; no delayq process is involved.
"""

import os
import sys
import time

import script_cost as sc
from kept_apart import used_memory


def run_once(n, listed):
    prelude = sc.prelude_text()
    schedule = open(os.path.join(sc.LUA, "schedule_batch.lua")).read()
    forward = open(os.path.join(sc.LUA, "forward.lua")).read()
    keys = sc.shard_keys("r", 0)
    got = {}

    def run(r):
        sc.load_library(r, "delayq_records", prelude, {"push": schedule, "forward": forward})
        before = used_memory(r)
        commands = []
        for start in range(0, n, 1000):
            msgs = []
            for i in range(start, min(start + 1000, n)):
                m = sc.message(1)
                m[3], m[4], m[5] = "m%d" % i, "in", "0"
                msgs.append(m)
            commands.append(sc.encode("FCALL", "push", len(keys), *keys, *sc.push_args(msgs)))
        sc.pushed(r, commands)
        time.sleep(0.01)
        policy = "86400000" if listed else "n:86400000"
        moved, cpu = 0, r.cpu_seconds()
        while moved < n:
            reply = r.call("FCALL", "forward", len(keys), *keys, *sc.forward_args(200, policy))
            if reply[0] == 0:
                sys.exit("forwarded %d of %d, then none" % (moved, n))
            moved += reply[0]
        got["us"] = (r.cpu_seconds() - cpu) / n * 1e6
        r.call("DEL", "bench:spread")
        got["bytes"] = (used_memory(r) - before) / n

    sc.with_redis(run)
    return got["bytes"], got["us"]


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    print("%d delivered messages, one shard, bytes a record:" % n)
    for round_ in range(1, rounds + 1):
        # Which goes first alternates: the machine's speed drifts.
        order = (True, False) if round_ % 2 else (False, True)
        got = {listed: run_once(n, listed) for listed in order}
        (with_b, with_us), (bare_b, bare_us) = got[True], got[False]
        print("  round %d: with the finished list %.1f B, without %.1f B: the list adds %+.1f B;"
              " forwarding %.1f against %.1f µs of Redis a message"
              % (round_, with_b, bare_b, with_b - bare_b, with_us, bare_us))


if __name__ == "__main__":
    main()
