#!/usr/bin/env python3
"""What delayq's scripts cost Redis beside the commands they send, in spread traffic.

    python3 bench/replay_cost.py [RATE] [SECONDS] [ROUNDS]

Starts a redis-server of its own on a free loopback port (removed at the end) and
paces RATE messages a second (default 1000) through delayq's push and forward of one
shard, the compact layouts, a call of each every millisecond (what single pushes
and a forward loop give), for SECONDS (default 2.5), as spread_floor.py's "delayq"
design does. `redis-cli monitor` records every command the two scripts send. Then,
ROUNDS times (default 3), side by side, each from an empty Redis, paced
tick for tick as recorded (the same messages a tick):

  delayq            the scripts themselves, loaded as the daemon loads them
  commands replayed one call of a function that does nothing but send the
                    recorded commands of a script call, in order, for each call
  writes alone      the same without the commands that only read (GET, EXISTS,
                    SMEMBERS, HGETALL, ZRANGE, LRANGE, LINDEX, HGET, TIME, ...)

Reported: Redis's own CPU time (`INFO cpu`) a message over the last two thirds of the
ticks. "delayq" less "commands replayed" is what the scripts' Lua costs beyond their
commands; "commands replayed" less "writes alone" what their reads cost. The run
exits unless every message delayq moved reached its stream exactly once.

Python's standard library and redis-cli; no delayq process is involved.
"""

import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import script_cost as sc  # noqa: E402
import spread_floor as sf  # noqa: E402

REPLAY = """#!lua name=replay
-- ARGV: count, command and its arguments (count values), count, ...
redis.register_function('replay', function(KEYS, ARGV)
  local i, n = 1, #ARGV
  while i <= n do
    local c = tonumber(ARGV[i])
    redis.call(unpack(ARGV, i + 1, i + c))
    i = i + c + 1
  end
  return 0
end)
"""

READS = {b"GET", b"EXISTS", b"SMEMBERS", b"HGETALL", b"ZRANGE", b"LRANGE", b"LINDEX", b"LLEN",
         b"ZREVRANGEBYLEX", b"ZRANGEBYLEX", b"ZLEXCOUNT", b"ZCOUNT", b"HGET", b"TIME", b"TYPE"}

# A MONITOR line: time, [db who], then the command's arguments, each quoted with
# sdscatrepr's escapes.
LINE = re.compile(rb'^\+?\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$')
ESCAPES = {ord('n'): b'\n', ord('r'): b'\r', ord('t'): b'\t', ord('a'): b'\a', ord('b'): b'\b',
           ord('\\'): b'\\', ord('"'): b'"'}


def arguments(text):
    """The quoted arguments of a MONITOR line, unescaped."""
    out, i = [], 0
    while i < len(text):
        if text[i] != ord('"'):
            i += 1
            continue
        i += 1
        arg = bytearray()
        while text[i] != ord('"'):
            if text[i] == ord('\\'):
                if text[i + 1] == ord('x'):
                    arg.append(int(text[i + 2:i + 4], 16))
                    i += 4
                else:
                    arg += ESCAPES[text[i + 1]]
                    i += 2
            else:
                arg.append(text[i])
                i += 1
        out.append(bytes(arg))
        i += 1
    return out


def setup(r):
    sf.load_delayq(r)
    r.call("FUNCTION", "LOAD", "REPLACE", REPLAY)


def record(rate, seconds):
    """delayq paced under `redis-cli monitor`: each tick's script calls, each a list of
    the commands it sent, and the messages each tick pushed."""
    lines = []

    def work(r):
        setup(r)
        with tempfile.TemporaryFile() as log:
            monitor = subprocess.Popen(["redis-cli", "-p", str(r.sock.getpeername()[1]), "monitor"],
                                       stdout=log)
            time.sleep(0.3)
            design = sf.Delayq("delayq")
            design.stream = "replay:recorded"
            tick, moved = design.tick, design.moved
            design.tick = lambda n: [sc.encode("ECHO", "tick")] + tick(n)
            design.moved = lambda replies, n: moved(replies[1:], n)
            sf.pace(r, design, rate, 0.001, seconds)
            time.sleep(0.5)
            monitor.terminate()
            monitor.wait()
            log.seek(0)
            lines.extend(log.read().splitlines())

    sc.with_redis(work)
    ticks, pushed, call = [], [], None
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        args = arguments(m.group(2))
        if m.group(1) != b"lua":
            if args[0].upper() == b"ECHO":
                ticks.append([])
                pushed.append(0)
            elif args[0].upper() == b"FCALL" and ticks:
                call = []
                ticks[-1].append(call)
                if args[1] == b"floor_push":
                    # FCALL, name, numkeys, keys, the push's leading values, its
                    # contexts (a count, six values each), then five values a message
                    # (script_cost.push_args).
                    rest = args[3 + int(args[2]) + len(sc.HEAD):]
                    pushed[-1] = (len(rest) - 1 - 6 * int(rest[0])) // 5
        elif call is not None:
            call.append(args)
    return ticks, pushed


def replayed(ticks, keep):
    """Each tick's calls as `replay` calls of the recorded commands `keep` keeps."""
    out = []
    for calls in ticks:
        encoded = []
        for commands in calls:
            argv = []
            for command in commands:
                if keep(command):
                    argv += [str(len(command)).encode()] + command
            encoded.append(sc.encode("FCALL", "replay", 0, *argv))
        out.append(encoded)
    return out


def paced(r, ticks, measured_from):
    """Sends each tick's calls a millisecond apart; Redis's CPU seconds from tick
    `measured_from` on, and every reply."""
    start, cpu, replies = time.perf_counter(), None, []
    for k, tick in enumerate(ticks):
        if k == measured_from:
            cpu = r.cpu_seconds()
        r.sock.sendall(b"".join(tick))
        replies.append([r.read() for _ in tick])
        pause = start + (k + 1) * 0.001 - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    return r.cpu_seconds() - cpu, replies


def main():
    rate = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 2.5
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    ticks, pushed = record(rate, seconds)
    calls = [c for t in ticks for c in t]
    if not calls:
        sys.exit("nothing recorded")
    start = len(ticks) // 3
    messages = sum(pushed[start:])
    print("%d msg/s asked, %d ticks recorded, %.1f messages and %.1f commands a script call "
          "measured" % (rate, len(ticks), messages / (len(ticks) - start),
                        sum(len(c) for t in ticks[start:] for c in t) / sum(len(t) for t in ticks[start:])))
    everything = replayed(ticks, lambda c: True)
    writes = replayed(ticks, lambda c: c[0].upper() not in READS)

    def work(r):
        setup(r)
        print("| round | delayq | commands replayed | writes alone |")
        print("|---|---|---|---|")
        for n in range(rounds):
            r.call("FLUSHALL")
            design = sf.Delayq("delayq")
            design.stream = "replay:delayq:%d" % n
            own, replies = paced(r, [design.tick(k) for k in pushed], start)
            moved = sum(design.moved(rs, k) for rs, k in zip(replies, pushed) if rs)
            sf.drain(r, design, sum(pushed) - moved)
            sf.delivered_once(r, design.stream, sum(pushed))
            figures = [own]
            for kind in (everything, writes):
                r.call("FLUSHALL")
                figures.append(paced(r, kind, start)[0])
            print("| %d | %s |" % (n + 1, " | ".join("%.1f µs a message" % (f / messages * 1e6)
                                                      for f in figures)))

    sc.with_redis(work)


if __name__ == "__main__":
    main()
