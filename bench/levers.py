#!/usr/bin/env python3
"""What each remaining lever of a push could win at most, side by side.

    python3 bench/levers.py [ORDER] [PER_CALL] [ROUNDS] [LEVER ...]

Loads the working tree's prelude and schedule_batch.lua twice into one redis-server
of its own (a free loopback port, removed at the end): once as they are, once with
one lever pulled as far as it goes, then alternates rounds of pushes of new messages
into one shard (as bench/script_ab.py does: 50 calls a round, `cmdstat_fcall` after
`CONFIG RESETSTAT`) and prints the median round of each, in µs of Redis a message.
A lever's copy is changed in memory by text replacements that must find their text
(the tool stops when the scripts no longer read that way), and does only what its
measurement needs: its messages are not readable by a forward, so nothing else runs.

The levers (all of them, or those named):
  hash     the id's SHA-1 handed in with the message (as the daemon could compute it),
           not computed by the script
  order    the call's messages handed in in (score, id) order (as the daemon could sort
           them), so the script's check finds them sorted and does not sort
  element  the compact element made of its score, id and packed fields alone: the
           least the script could do if the daemon wrote the body (an upper bound: the
           clock's `created` would still have to go in)
  rehash   an index split that finds every id's hash kept (as if the index stored
           it), so it moves entries without a SHA-1
  ahead    the index sized ahead (2^13 buckets from the start, not 2^INDEX_MIN_K), so
           it never splits here
  compare  no id compared with the bucket's last as messages are appended (what an
           order known without comparing bytes would save; ULIDs of one millisecond
           share 24 of their 26 bytes)
  entry    no index entry written (its `HSETNX` left out, and with it what the
           splits move): the index's own part of a push, an upper bound
  answer   the call answers one value in all, not one for each message stored
  all      hash, order, element and ahead at once

ORDER is random (ULIDs with a random part; default) or counting (ULIDs counting up
within the millisecond); PER_CALL (default 400) messages a call, all due in the
call's own millisecond a day ahead; ROUNDS (default 10) rounds of each.

Only Python's standard library; no delayq process is involved.
"""

import hashlib
import statistics
import sys

import script_ab as ab
import script_cost as sc

# Each lever: (replacements in the prelude, in schedule_batch.lua, whether the calls
# carry the ids' hashes, whether they come in order).
HASH_KEPT = (
    "    local S, id = context.S, ARGV[i + 1]\n",
    "    local S, id = context.S, ARGV[i + 1]\n"
    "    if ARGV[i + 3] ~= '' then id_hashes[id] = tonumber(ARGV[i + 3], 16) end\n",
)
HASH_KEY_IGNORED = (
    "context.plain and S.compact_only and ARGV[i + 3] == '' and",
    "context.plain and S.compact_only and",
)
ELEMENT = (
    "        S.msg[k] = new_body(context.stream, ARGV[i + 4], context.priority, now, expire_at, score_bytes(score),\n"
    "          string.char(#id), id)\n",
    "        S.msg[k] = score_bytes(score) .. string.char(#id) .. id .. ARGV[i + 4]\n",
)
REHASH_KEEP = (
    "      id_hashes[id] = h\n",
    "      id_hashes[id] = h\n      kept_hashes[id] = h\n",
)
REHASH_DECL = ("local id_hashes = {}\n", "local id_hashes = {}\nlocal kept_hashes = {}\n")
REHASH_USE = (
    "if record_hash(all[i]) % (2 * m) ~= gen.s then",
    "if (kept_hashes[all[i]] or record_hash(all[i])) % (2 * m) ~= gen.s then",
)
AHEAD = (
    "local ix = { key = bodies .. ':ix', k = INDEX_MIN_K, s = 0, n = 0 }",
    "local ix = { key = bodies .. ':ix', k = 13, s = 0, n = 0 }",
)
COMPARE = ("    if not key_before(tail.score, tail.id, scores[i], ids[i]) then return false end\n", "")
ENTRY = (
    "    if redis.call('HSETNX', bucket, id, int_text(score)) == 0 then",
    "    if false then",
)
ANSWER = ("\nreturn out\n", "\nreturn { 1 }\n")

LEVERS = {
    "hash": ([], [HASH_KEPT, HASH_KEY_IGNORED], True, False),
    "order": ([], [], False, True),
    "element": ([], [ELEMENT], False, False),
    "rehash": ([REHASH_DECL, REHASH_KEEP, REHASH_USE], [], False, False),
    "ahead": ([AHEAD], [], False, False),
    "compare": ([COMPARE], [], False, False),
    "entry": ([ENTRY], [], False, False),
    "answer": ([], [ANSWER], False, False),
    "all": ([AHEAD], [HASH_KEPT, HASH_KEY_IGNORED, ELEMENT], True, True),
}


def pulled(text, replacements):
    for old, new in replacements:
        if text.count(old) != 1:
            sys.exit("the scripts no longer read %r once: update bench/levers.py" % old.strip())
        text = text.replace(old, new)
    return text


def shaping(hashed, ordered):
    """What a lever does to a call's messages before they are sent: each id's SHA-1
    handed in as its business key (none is given here), the messages sorted by id (one due time and priority:
    their (score, id) order); None when it does neither."""
    if not (hashed or ordered):
        return None

    def shaped(msgs):
        if hashed:
            for m in msgs:
                m[8] = hashlib.sha1(m[3].encode()).hexdigest()[:8]
        if ordered:
            msgs.sort(key=lambda m: m[3])
        return msgs

    return shaped


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    order = sys.argv[1] if len(sys.argv) > 1 else "random"
    per_call = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    names = sys.argv[4:] or list(LEVERS)
    if order not in ("random", "counting"):
        sys.exit("ORDER is random or counting, not %r" % order)
    for name in names:
        if name not in LEVERS:
            sys.exit("no lever %r (%s)" % (name, ", ".join(LEVERS)))
    prelude, schedule = ab.scripts(None)

    def work(r):
        print("%s ids, %d a call into one shard, median of %d rounds of %d calls, µs of Redis a message:"
              % (order, per_call, rounds, ab.CALLS))
        for name in names:
            in_prelude, in_schedule, hashed, ordered = LEVERS[name]
            sc.load_library(r, "as_is", prelude, {"push_as_is": schedule})
            sc.load_library(r, "lever", pulled(prelude, in_prelude),
                            {"push_lever": pulled(schedule, in_schedule)})
            r.call("FLUSHALL")

            def calls_of(tag, ms, serial):
                shaped = shaping(hashed, ordered) if tag == "lever" else None
                return ab.calls(tag, order, per_call, 1, ms, serial, shaped=shaped)

            cost = ab.alternated(r, ("as_is", "lever"), rounds, per_call, calls_of)
            as_is, lever = statistics.median(cost["as_is"]), statistics.median(cost["lever"])
            print("  %-8s as it is %5.1f   lever pulled %5.1f   %+5.1f" % (name, as_is, lever, lever - as_is))

    sc.with_redis(work)


if __name__ == "__main__":
    main()
