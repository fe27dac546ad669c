#!/usr/bin/env python3
"""Redis time of the schedule script, one version against another, side by side.

    python3 bench/script_ab.py BASE [ORDER] [PER_CALL] [SHARDS] [ROUNDS] [MODE]

Loads the prelude and schedule_batch.lua of git revision BASE and of the working
tree as two libraries of Redis Functions in one redis-server of its own (a free
loopback port, removed at the end), then alternates rounds: 50 calls of one
version, 50 of the other (which goes first alternates too), each round's calls
pipelined after `CONFIG RESETSTAT`, its cost read from `INFO commandstats`
(`cmdstat_fcall`). Prints the median round of each, per message. Both versions
see the same Redis, the same load on the machine and the same shapes of call, so
their difference is the scripts' (the same script against itself differs by up
to about 10%). Both are called with the working tree's arguments, so BASE must
read them the same way (a revision from the one that added the streams kept apart,
ARGV[7], on), but for the fields: each version gets them packed or as pairs, as
its prelude reads them.

Each call carries PER_CALL (default 200) new 100-byte messages spread over SHARDS
(default 1) shards, all due in the call's own millisecond (a day ahead, later with
every call, as messages pushed with one delay are), with ids in ORDER:
  random     ULIDs whose random part is random (ids made elsewhere, UUID-like)
  counting   ULIDs counting up within the millisecond (the ids delayq makes)
  arrival    `a<n>` ids of the call shuffled (pushes that arrive together)
ROUNDS (default 20) rounds of each. MODE (default new) is every message's mode: new
(its id looked up first) or fresh (an id the caller has just made, stored without a
lookup; a BASE from before that mode takes it as new).

Only Python's standard library and git; no delayq process is involved.
"""

import os
import random
import statistics
import subprocess
import sys

import script_cost as sc

CALLS = 50
B32 = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(ms, rand):
    v = (ms << 80) | rand
    return "".join(B32[(v >> (5 * (25 - i))) & 31] for i in range(26))


def scripts(revision, *names):
    """(prelude, the script of each name, schedule_batch.lua when none is named) of
    `revision`, or of the working tree for None."""
    names = names or ("schedule_batch.lua",)
    if revision is None:
        return (sc.prelude_text(),) + tuple(open(os.path.join(sc.LUA, n)).read() for n in names)

    def show(path):
        return subprocess.run(["git", "-C", sc.ROOT, "show", "%s:%s" % (revision, path)],
                              check=True, capture_output=True, text=True).stdout

    # A revision keeps its scripts under src/store/lua or (later) client/src/store/lua,
    # its prelude in one file or (later) in parts joined by name.
    lua = next(d for d in ("client/src/store/lua", "src/store/lua")
               if subprocess.run(["git", "-C", sc.ROOT, "cat-file", "-e", "%s:%s" % (revision, d)],
                                 capture_output=True).returncode == 0)
    parts = subprocess.run(["git", "-C", sc.ROOT, "ls-tree", "--name-only",
                            "%s:%s/prelude" % (revision, lua)],
                           capture_output=True, text=True)
    if parts.returncode == 0:
        prelude = "\n".join(show(lua + "/prelude/" + n)
                            for n in sorted(parts.stdout.split()) if n.endswith(".lua"))
    else:
        prelude = show(lua + "/prelude.lua")
    return (prelude,) + tuple(show(lua + "/" + n) for n in names)


def calls(tag, order, per_call, shards, ms, serial, mode="new", packed=True, shaped=None, flat=False):
    """CALLS encoded FCALLs of `tag`'s library (its messages' fields packed or not,
    as its prelude reads them; each call's messages as `shaped(messages)` returns
    them, when given; flat: records whole, as revisions before the contexts take
    them, see sc.push_args); the next millisecond and serial."""
    out = []
    keys = [k for s in range(shards) for k in sc.shard_keys(tag, s)]
    for _ in range(CALLS):
        ms += 1
        start = random.getrandbits(79)
        msgs = []
        for j in range(per_call):
            if order == "random":
                mid = ulid(ms, random.getrandbits(80))
            elif order == "counting":
                mid = ulid(ms, start + j)
            else:
                mid = "a%d" % (serial + j)
            m = sc.message(j % shards + 1, packed)
            m[1], m[3], m[4], m[5] = mode, mid, "at", str(ms + 86_400_000)
            msgs.append(m)
        serial += per_call
        if order == "arrival":
            random.shuffle(msgs)
        if shaped:
            msgs = shaped(msgs)
        args = sc.push_args(msgs, flat=flat)
        out.append(sc.encode("FCALL", "push_" + tag, len(keys), *keys, *args))
    return out, ms, serial


def alternated(r, tags, rounds, per_call, calls_of):
    """Rounds of pushes of two kinds, alternated (which goes first alternates too):
    `calls_of(tag, ms, serial)` gives a round's encoded calls and the next ms and
    serial (both start at 1_800_000_000_000 and 0). Each round's calls pipelined
    after `CONFIG RESETSTAT`; returns each tag's rounds' costs, in µs of Redis a
    message (`cmdstat_fcall`)."""
    cost = {tag: [] for tag in tags}
    state = {tag: (1_800_000_000_000, 0) for tag in tags}
    for n in range(rounds):
        for tag in (tags if n % 2 else tags[::-1]):
            commands, ms, serial = calls_of(tag, *state[tag])
            state[tag] = (ms, serial)
            r.call("CONFIG", "RESETSTAT")
            _, replies = r.pipelined(commands)
            for reply in replies:
                if not sc.stored(reply):
                    sys.exit("%s: unexpected reply %r" % (tag, reply))
            cost[tag].append(sc.commandstats_usec(r).get("fcall", 0) / len(commands) / per_call)
    return cost


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    base = sys.argv[1]
    order = sys.argv[2] if len(sys.argv) > 2 else "random"
    per_call = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    shards = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 20
    mode = sys.argv[6] if len(sys.argv) > 6 else "new"
    if mode not in ("new", "fresh"):
        sys.exit("MODE is new or fresh, not %r" % mode)
    if order not in ("random", "counting", "arrival"):
        sys.exit("ORDER is random, counting or arrival, not %r" % order)
    versions = {"base": scripts(base), "tree": scripts(None)}

    def work(r):
        for tag, (prelude, schedule) in versions.items():
            sc.load_library(r, "ab_" + tag, prelude, {"push_" + tag: schedule})
        # A revision whose schedule calls carry the fields packed reads them as
        # packed_fields (read_new_message); an older one, as a count and pairs.
        packed = {tag: "packed_fields" in prelude for tag, (prelude, _) in versions.items()}
        # One whose schedule calls carry contexts names them in schedule_batch.lua.
        flat = {tag: "n_contexts" not in schedule for tag, (_, schedule) in versions.items()}
        cost = alternated(r, ("base", "tree"), rounds, per_call,
                          lambda tag, ms, serial: calls(tag, order, per_call, shards, ms, serial,
                                                        mode, packed[tag], flat=flat[tag]))
        print("%s ids (%s), %d a call over %d shard(s), median of %d rounds of %d calls:"
              % (order, mode, per_call, shards, rounds, CALLS))
        for tag, label in (("base", base), ("tree", "working tree")):
            print("  %-14s %.1f µs of Redis a message" % (label, statistics.median(cost[tag])))

    sc.with_redis(work)

if __name__ == "__main__":
    main()
