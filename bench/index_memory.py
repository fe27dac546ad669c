#!/usr/bin/env python3
"""Redis memory a pending message takes, one version of the scripts against another.

    python3 bench/index_memory.py BASE [COUNT ...]

Loads the prelude and schedule_batch.lua of git revision BASE and of the working tree
as two libraries of Redis Functions in one redis-server of its own (a free loopback
port, removed at the end). For each COUNT (default 4000 16000 80000 160000), and each
version in turn on an emptied Redis (after a first fill of each, not counted): pushes COUNT new 100-byte messages under
26-character ULIDs given as a producer gives them (so each has an index entry) over
16 shards, in 50 calls, and prints `used_memory` after, less before, a message. What
differs between the two is what their layouts take, the index's buckets among it.

Only Python's standard library and git; no delayq process is involved.
"""

import sys

import script_ab as ab
import script_cost as sc

SHARDS = 16


def used_memory(r):
    info = r.call("INFO", "memory").decode()
    return int(dict(line.split(":", 1) for line in info.splitlines() if ":" in line)["used_memory"])


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    base = sys.argv[1]
    counts = [int(c) for c in sys.argv[2:]] or [4000, 16000, 80000, 160000]
    versions = {"base": ab.scripts(base), "tree": ab.scripts(None)}

    def fill(r, tag, count):
        """Bytes of Redis a message after `count` pushed by `tag` into an emptied Redis."""
        r.call("FLUSHALL")
        before = used_memory(r)
        calls, _, _ = ab.calls(tag, "random", count // ab.CALLS, SHARDS, 1_800_000_000_000, 0)
        _, replies = r.pipelined(calls)
        for reply in replies:
            if not sc.stored(reply):
                sys.exit("%s: unexpected reply %r" % (tag, reply))
        return (used_memory(r) - before) / count

    def work(r):
        for tag, (prelude, schedule) in versions.items():
            sc.load_library(r, "mem_" + tag, prelude, {"push_" + tag: schedule})
            # A first fill of each, not counted: what Redis allocates once (its Lua
            # engine's heap, say) is not the messages'.
            fill(r, tag, counts[0])
        print("ULIDs given by producers over %d shards, bytes of Redis a pending message:" % SHARDS)
        for count in counts:
            print("  %7d messages: %s %.1f B, working tree %.1f B"
                  % (count, base, fill(r, "base", count), fill(r, "tree", count)))

    sc.with_redis(work)


if __name__ == "__main__":
    main()
