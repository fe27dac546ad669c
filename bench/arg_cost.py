#!/usr/bin/env python3
"""What a schedule call's arguments cost Redis to take in, before any script runs.

    python3 bench/arg_cost.py [ROUNDS]

Starts a redis-server of its own on a free loopback port (removed at the end) and
sends calls of 500 messages to a function that returns at once: each message as the
eleven values a record used to be (inbox entry, mode, shard, id, due kind, due value,
priority, ttl, key, stream, fields), and as the five a message carries with its
shared values once a call (script_cost.push_args: context number, id, due value,
key, fields). 400 calls a round, pipelined; ROUNDS (default 7) rounds of each,
alternated. Reports Redis's CPU time (`INFO cpu`: reading the command, making its
arguments and handing them to Lua, which `INFO commandstats` does not count) a
message, the median round.

Only Python's standard library; no delayq process is involved.
"""

import statistics
import sys

import script_cost as sc


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7

    def work(r):
        r.call("FUNCTION", "LOAD", "REPLACE",
               "#!lua name=arg_cost\nredis.register_function('nothing', function() return 1 end)\n")
        msgs = [sc.message(1) for _ in range(500)]
        variants = {
            "eleven values a message": sc.push_args(msgs, flat=True),
            "shared values once, five a message": sc.push_args(msgs),
        }
        calls = {k: sc.encode("FCALL", "nothing", 0, *args) for k, args in variants.items()}
        cost = {k: [] for k in calls}
        for n in range(rounds):
            for k in (list(calls) if n % 2 else list(calls)[::-1]):
                per_call, _ = r.pipelined([calls[k]] * 400)
                cost[k].append(per_call / len(msgs))
        print("calls of %d messages to a function that returns at once, Redis CPU µs a message, "
              "median of %d rounds (all rounds):" % (len(msgs), rounds))
        for k, v in cost.items():
            print("  %-36s %.2f  (%s)" % (k, statistics.median(v), ", ".join("%.2f" % x for x in v)))

    sc.with_redis(work)


if __name__ == "__main__":
    main()
