#!/usr/bin/env python3
"""What an inbox entry's leaving costs Redis: an XDEL for each, against one XTRIM
MINID for all, after the XACK each takes either way.

    python3 bench/inbox_trim.py [ENTRIES] [PER_CALL] [ROUNDS]

A redis-server of its own gets ENTRIES (default 100,000) entries of an inbox's
shape (a target stream, a delay, a 100-byte payload) and a group made at id 0; a
consumer then reads PER_CALL (default 500) at a time and one script call
acknowledges each read: `XACK` then `XDEL` of every entry, `XACK` then one `XTRIM
MINID` at the read's last entry, or `XACK` alone. Prints, for each round (default
3), Redis's CPU µs an entry in the script calls and in the reads, and each
command's own µs an entry (INFO commandstats). Only Python's standard library.
"""

import script_cost as sc

ACK = "redis.call('XACK', KEYS[1], 'g', unpack(ARGV))\n"
WAYS = {
    "XACK + XDEL each": ACK + "redis.call('XDEL', KEYS[1], unpack(ARGV))\nreturn 1",
    "XACK + XTRIM MINID": ACK + "redis.call('XTRIM', KEYS[1], 'MINID', ARGV[#ARGV])\nreturn 1",
    "XACK alone": ACK + "return 1",
}


def measure(r, script, entries, per_call):
    sc.fill_inbox(r, entries)
    sha = r.call("SCRIPT", "LOAD", script)
    r.call("CONFIG", "RESETSTAT")
    in_calls = in_reads = 0.0
    while True:
        before = r.cpu_seconds()
        reply = r.call("XREADGROUP", "GROUP", "g", "c", "COUNT", per_call, "STREAMS", "inbox", ">")
        read = r.cpu_seconds()
        in_reads += read - before
        if not reply:
            break
        ids = [e[0] for e in reply[0][1]]
        r.call("EVALSHA", sha, 1, "inbox", *ids)
        in_calls += r.cpu_seconds() - read
    own = sc.commandstats_usec(r)
    return (in_calls / entries * 1e6, in_reads / entries * 1e6,
            {k: own[k] / entries for k in ("xack", "xdel", "xtrim") if k in own},
            r.call("XLEN", "inbox"))


def main():
    entries, per_call, rounds = sc.int_args(100_000, 500, 3)

    def work(r):
        def row(n, name, script):
            calls, reads, own, left = measure(r, script, entries, per_call)
            own = ", ".join("%s %.2f" % kv for kv in sorted(own.items()))
            return [str(n), name, "%.2f" % calls, "%.2f" % reads, own, str(left)]

        sc.rounds_table(["round", "way", "script µs an entry", "read µs an entry",
                         "commands' own µs an entry", "left"], rounds, WAYS, row)

    sc.with_redis(work)


if __name__ == "__main__":
    main()
