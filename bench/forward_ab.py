#!/usr/bin/env python3
"""Redis time of the forward script, one version against another, side by side.

    python3 bench/forward_ab.py BASE [BATCH] [ROUNDS] [N]

Loads the prelude, schedule_batch.lua and forward.lua of git revision BASE and of the
working tree as two libraries of Redis Functions in one redis-server of its own (a free
loopback port, removed at the end), then alternates rounds (which version goes first
alternates too): each round stores N (default 10,000) 100-byte messages due at once in
one shard through its version's push, then drains them through its version's forward
in calls of BATCH (default 200, the forwarder's batch_size), delivery records kept a
day, the forward's calls read after `CONFIG RESETSTAT` (`cmdstat_fcall`). Prints the
median round of each, in µs of Redis a message moved: what a burst's drain costs
Redis in each version. BASE must take the working tree's push and forward arguments
(see bench/script_ab.py).

Only Python's standard library and git; no delayq process is involved.
"""

import statistics
import sys
import time

import script_ab
import script_cost as sc


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    base = sys.argv[1]
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 10_000
    versions = {tag: script_ab.scripts(revision, "schedule_batch.lua", "forward.lua")
                for tag, revision in (("base", base), ("tree", None))}

    def work(r):
        for tag, (prelude, schedule, forward) in versions.items():
            sc.load_library(r, "fab_" + tag, prelude, {"push_" + tag: schedule, "fwd_" + tag: forward})
        args = sc.forward_args(batch, 86_400_000)
        cost = {tag: [] for tag in versions}
        for k in range(rounds):
            for tag in (("base", "tree") if k % 2 else ("tree", "base")):
                keys = sc.shard_keys("%s%d" % (tag, k), 0)
                sc.fill(r, "push_" + tag, keys, n, 1)
                time.sleep(0.01)
                r.call("CONFIG", "RESETSTAT")
                moved = 0
                while moved < n:
                    reply = r.call("FCALL", "fwd_" + tag, len(keys), *keys, *args)
                    if reply[0] == 0:
                        sys.exit("%s: %d of %d moved, then none" % (tag, moved, n))
                    moved += reply[0]
                cost[tag].append(sc.commandstats_usec(r).get("fcall", 0) / moved)
                r.call("FLUSHALL")
        print("a drain of %d due in one shard, calls of %d, median of %d rounds:" % (n, batch, rounds))
        for tag, label in (("base", base), ("tree", "working tree")):
            print("  %-14s %.1f µs of Redis a message" % (label, statistics.median(cost[tag])))

    sc.with_redis(work)


if __name__ == "__main__":
    main()
