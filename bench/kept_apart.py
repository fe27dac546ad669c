#!/usr/bin/env python3
"""Redis memory and push time of messages kept apart (`streams.max_rate`) against
the compact pending layout.

    python3 bench/kept_apart.py [MESSAGES]

Loads the working tree's prelude and schedule_batch.lua as a library of Redis
Functions in one redis-server of its own (a free loopback port, removed at the
end) and stores MESSAGES (default 100,000) 100-byte messages, due a day ahead one
millisecond apart, in calls of 1000: once into a shard's compact layout, once
into another shard kept apart (its stream's held set and the bodies hash). Prints,
for each, `used_memory` after the fill less before it, and Redis's CPU time of the
calls, per message.

Only Python's standard library; no delayq process is involved.
"""

import os
import sys

import script_cost as sc


def fill(r, keys, n, apart):
    """Stores n messages in the shard of `keys`; returns Redis CPU µs a message."""
    head = list(sc.HEAD)
    if apart:
        head[-1:] = ["1", "bench:spread"]
    commands = []
    for start in range(0, n, 1000):
        msgs = []
        for i in range(start, min(start + 1000, n)):
            m = sc.message(1)
            m[4], m[5] = "in", str(86_400_000 + i)
            msgs.append(m)
        commands.append(sc.encode("FCALL", "push", len(keys), *keys, *sc.push_args(msgs, head)))
    return sc.pushed(r, commands) * len(commands) / n


def used_memory(r):
    info = r.call("INFO", "memory").decode()
    return int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("used_memory:")))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    prelude = sc.prelude_text()
    schedule = open(os.path.join(sc.LUA, "schedule_batch.lua")).read()

    def run(r):
        sc.load_library(r, "delayq_apart", prelude, {"push": schedule})
        for label, tag, apart in (("compact layout", "c", False), ("kept apart", "a", True)):
            before = used_memory(r)
            cpu = fill(r, sc.shard_keys(tag, 0), n, apart)
            print("%-15s %6.1f bytes a message  %5.1f µs of Redis a message"
                  % (label, (used_memory(r) - before) / n, cpu))

    sc.with_redis(run)


if __name__ == "__main__":
    main()
