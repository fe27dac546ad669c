#!/usr/bin/env python3
"""Redis CPU time of one schedule script call, taken apart.

    python3 bench/script_cost.py [calls]

Starts a redis-server of its own on a free loopback port (removed at the end),
loads client/src/store/lua (the prelude and schedule_batch.lua) and sends each variant
below `calls` times (default 5000), pipelined, reading Redis's own CPU time
(`INFO cpu`, user + sys) before and after: what one call costs Redis, its
command parsing and reply included, with no client waiting in between. Every
push stores one new 100-byte message due in 500 s, as the spread producer does.

Variants:
  return 1                 EVALSHA of a script that only returns, with a push's arguments
  prelude, return 1        the same after defining the prelude (what every script call does first)
  push, 16 shards: 16 calls    one message in each of 16 shards, a call each
  push, 16 shards: 1 call      the same 16 messages in one call (standalone Redis)
  push, 1 shard: 1 call        16 messages of one shard in one call
  push as a Redis Function     the one-shard push as FCALL of a library that defines
                               the prelude once, when it is loaded

Then a steady stream through one shard, as the spread scenario's: each round pushes
two messages due 200 ms later (one FCALL) and forwards what is due (one FCALL of
forward.lua, batches of 50), rounds pipelined, after a second of rounds to fill the
200 ms ahead; alone, and ahead of a backlog of 200,000 messages due an hour later
(the backlog-spread scenario's shape). Reported per round (a push and a forward).

Then a drain, as a burst's: 20,000 messages already due in one shard, forwarded in
calls of 1000 (forward.lua) until none is left, with delivery records kept (a day)
and with none (`records.retention = 0`); then the same 20,000 for a stream at its
rate limit, set aside in its held set by calls with no permits, then sent from there
by calls whose permits do not bind; and the same 20,000 drained by the bench's
ceiling (src/cli/bench/ceiling.lua, only the XADD a message), side by side. Reported
per message moved (set aside, in the
third): Redis's CPU time in all, and the part of it that the commands the script
calls took on their own (`INFO commandstats`); the rest is Lua and the calls into
Redis from it.

Only Python's standard library; no delayq process is involved.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LUA = os.path.join(ROOT, "client", "src", "store", "lua")


def prelude_text(lua=None):
    """The prelude as the daemon joins it: the parts of client/src/store/lua/prelude/ in
    their names' order."""
    folder = os.path.join(lua or LUA, "prelude")
    return "\n".join(open(os.path.join(folder, n)).read() for n in sorted(os.listdir(folder))
                     if n.endswith(".lua"))


def encode(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Redis:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError("unexpected reply %r" % line)

    def call(self, *args):
        self.sock.sendall(encode(*args))
        return self.read()

    def call_encoded(self, command):
        """The reply to one command already encoded (encode)."""
        self.sock.sendall(command)
        return self.read()

    def cpu_seconds(self):
        info = self.call("INFO", "cpu").decode()
        fields = dict(l.split(":", 1) for l in info.splitlines() if ":" in l)
        return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])

    def pipelined(self, commands):
        """Redis CPU µs per command over `commands`, sent at once; the replies."""
        before = self.cpu_seconds()
        self.sock.sendall(b"".join(commands))
        replies = [self.read() for _ in commands]
        return (self.cpu_seconds() - before) / len(commands) * 1e6, replies


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shard_keys(tag, shard):
    t = "{%s:%d}" % (tag, shard)
    return [t + ":due", t + ":msg", t + ":done", t + ":done-by-expiry", t + ":fence", t + ":held"]


# The prelude's per-call caches (store/scripts.rs, PER_CALL_CACHES).
CACHES = ["call_epoch", "id_hashes", "generations_of", "hash_layout_in_use", "pending_states", "key_indexes"]
HEAD = ["0", "31536000000", "bench:wake", "", "", "compact", "0"]
counter = iter(range(10**9))


def packed_strings(strings):
    """A list of strings as one MessagePack array, each in its shortest form (what
    NewMessage::script_args sends as a message's fields)."""
    n = len(strings)
    out = [bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")]
    for s in strings:
        b = s.encode()
        if len(b) < 32:
            out.append(bytes([0xa0 | len(b)]))
        elif len(b) < 256:
            out.append(b"\xd9" + bytes([len(b)]))
        elif len(b) < 65536:
            out.append(b"\xda" + len(b).to_bytes(2, "big"))
        else:
            out.append(b"\xdb" + len(b).to_bytes(4, "big"))
        out.append(b)
    return b"".join(out)


def message(group, packed=True):
    """schedule_batch.lua's record: inbox entry, mode, shard, id, due kind and value,
    priority, ttl, business key, stream, then the fields packed (or, for scripts
    before they came packed, `packed=False`: field count, field, value)."""
    head = ["", "new", str(group), "m%d" % next(counter), "in", "500000", "0", "0", "",
            "bench:spread"]
    if packed:
        return head + [packed_strings(["payload", "x" * 100])]
    return head + ["1", "payload", "x" * 100]


def push_args(msgs, head=HEAD, flat=False):
    """schedule_batch.lua's arguments for `msgs` (records as message() makes them) after
    `head`: what messages share, once (contexts: mode, shard, due kind, priority, ttl,
    stream), then each message's context number, its inbox entry (when `head` names an
    inbox), id, due value, key and fields. flat: each record whole, as revisions before
    the contexts (2026-12-06) take them."""
    if flat:
        return list(head) + [a for m in msgs for a in m]
    contexts, numbers, own = [], {}, []
    inbox = head[3] != ""
    for m in msgs:
        shared = (m[1], m[2], m[4], m[6], m[7], m[9])
        if shared not in numbers:
            numbers[shared] = str(len(contexts) + 1)
            contexts.append(shared)
        own.append(numbers[shared])
        if inbox:
            own.append(m[0])
        own += [m[3], m[5], m[8], m[10]]
    return list(head) + [str(len(contexts))] + [v for c in contexts for v in c] + own


def with_redis(work):
    """Runs `work(connection)` against a redis-server of its own on a free loopback
    port, in a temporary directory, stopped and removed afterwards."""
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", data],
            stdout=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    r = Redis(port)
                    r.call("PING")
                    break
                except (ConnectionError, RuntimeError):
                    time.sleep(0.05)
            else:
                sys.exit("redis-server did not start")
            work(r)
        finally:
            server.terminate()
            server.wait()


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    prelude = prelude_text()
    schedule = open(os.path.join(LUA, "schedule_batch.lua")).read()
    with_redis(lambda r: run(r, calls, prelude, schedule))


def run(r, calls, prelude, schedule):
    def evalsha(body, batch):
        sha = r.call("SCRIPT", "LOAD", body)
        return [encode("EVALSHA", sha, len(keys), *keys, *args) for keys, args in batch]

    def show(label, commands, per):
        cost, replies = r.pipelined(commands)
        for reply in replies:
            if isinstance(reply, list) and not stored(reply):
                sys.exit("%s: unexpected reply %r" % (label, reply[:3]))
        print("| %s | %.1f µs | %.1f µs |" % (label, cost, cost / per))

    one = lambda tag: (shard_keys(tag, 0), push_args([message(1)]))
    print("| variant | Redis CPU per call | per message |")
    print("|---|---|---|")
    show("return 1", evalsha("return 1", [one("a")] * calls), 1)
    show("prelude, return 1", evalsha(prelude + "\nreturn 1", [one("a")] * calls), 1)
    sixteen = []
    for _ in range(calls // 16):
        sixteen += [(shard_keys("b", s), push_args([message(1)])) for s in range(16)]
    show("push, 16 shards: 16 calls of one message", evalsha(prelude + "\n" + schedule, sixteen), 1)
    together = []
    for _ in range(calls // 16):
        keys = [k for s in range(16) for k in shard_keys("c", s)]
        together.append((keys, push_args([message(s + 1) for s in range(16)])))
    show("push, 16 shards: 1 call of 16 messages", evalsha(prelude + "\n" + schedule, together), 16)
    one_shard = []
    for _ in range(calls // 16):
        one_shard.append((shard_keys("f", 0), push_args([message(1) for _ in range(16)])))
    show("push, 1 shard: 1 call of 16 messages", evalsha(prelude + "\n" + schedule, one_shard), 16)
    load_library(r, "delayq_cost", prelude, {"push": schedule})
    fcalls = []
    for _ in range(calls):
        keys, args = one("d")
        fcalls.append(encode("FCALL", "push", len(keys), *keys, *args))
    show("push, one shard, as a Redis Function (FCALL)", fcalls, 1)
    evals = evalsha(prelude + "\n" + schedule, [one("e") for _ in range(calls)])
    show("push, one shard (EVALSHA)", evals, 1)
    steady(r, calls, prelude, schedule)
    drain(r, prelude, schedule)


def stored(reply):
    """Whether a push's answer says its first message was stored as new: its due time
    alone (an integer), or, from scripts before that answer, the status "scheduled"."""
    return isinstance(reply, list) and len(reply) > 0 and (
        isinstance(reply[0], int) or reply[0] == b"scheduled")


def pushed(r, commands):
    """Sends push `commands` at once; Redis CPU µs a call. Exits if one was refused."""
    cost, replies = r.pipelined(commands)
    for reply in replies:
        if not stored(reply):
            sys.exit("a call failed: %r" % (reply,))
    return cost


def load_library(r, library, prelude, functions):
    """Loads `functions` (name -> script body) as a library of Redis Functions after
    the prelude; the prelude's per-call caches start empty in every call."""
    caches = CACHES
    text = "#!lua name=%s\n%s\nlocal function fresh()\n%send\n" % (
        library, prelude, "".join("%s = {}\n" % c for c in caches))
    for name, body in functions.items():
        text += "redis.register_function('%s', function(KEYS, ARGV)\nfresh()\n%s\nend)\n" % (name, body)
    r.call("FUNCTION", "LOAD", "REPLACE", text)


def fill(r, function, keys, n, due_in_ms):
    """Stores n messages in the shard of `keys`, due due_in_ms after they are stored,
    in calls of 1000 of the push `function`."""
    for start in range(0, n, 1000):
        msgs = []
        for _ in range(min(1000, n - start)):
            m = message(1)
            m[5] = str(due_in_ms)
            msgs.append(m)
        r.call("FCALL", function, len(keys), *keys, *push_args(msgs))


def forward_args(batch, retention_ms, limited=()):
    """forward.lua's arguments: epoch, batch, records policy, id and attempt fields,
    dead-letter suffix, unreadable stream, MAXLEN, not a cluster, no key field, the
    rate-limited streams' (stream, budget) pairs, no streams' own key fields."""
    args = ["1", str(batch), str(retention_ms), "delayq-id", "delayq-attempt", ":dead",
            "bench:unreadable", "0", "", "", str(len(limited))]
    for stream, budget in limited:
        args += [stream, str(budget)]
    return args + ["0"]


def steady(r, calls, prelude, schedule):
    forward = open(os.path.join(LUA, "forward.lua")).read()
    load_library(r, "delayq_steady", prelude,
                 {"steady_push": schedule, "steady_forward": forward})
    steady_forward_args = forward_args(50, 86400000)

    def rounds(tag, n):
        keys = shard_keys(tag, 0)
        out = []
        for _ in range(n):
            msgs = []
            for _ in range(2):
                m = message(1)
                m[5] = "200"  # due in 200 ms
                msgs.append(m)
            out.append(encode("FCALL", "steady_push", len(keys), *keys, *push_args(msgs)))
            out.append(encode("FCALL", "steady_forward", len(keys), *keys, *steady_forward_args))
        return out

    def moved(replies):
        return sum(rep[0] for rep in replies[1::2])

    for label, backlog in (("alone", 0), ("ahead of 200,000 due an hour later", 200_000)):
        tag = "steady%d" % backlog
        fill(r, "steady_push", shard_keys(tag, 0), backlog, 3_600_000)
        deadline = time.time() + 1
        while time.time() < deadline:
            r.pipelined(rounds(tag, 200))
        cost, replies = r.pipelined(rounds(tag, calls))
        per_round = cost * 2
        print("| steady stream, %s | %.1f µs a round | %.2f messages moved a round |"
              % (label, per_round, moved(replies) / calls))


def int_args(*defaults):
    """The command line's arguments as integers, each missing one its default."""
    return [int(sys.argv[i + 1]) if len(sys.argv) > i + 1 else d for i, d in enumerate(defaults)]


def fill_inbox(r, entries, ids=False):
    """A new inbox of `entries` entries of the inbox's shape (a target stream, a delay,
    with `ids` an id, a 100-byte payload), XADDed pipelined, and a group g made at id 0."""
    r.call("DEL", "inbox")
    adds = [inbox_xadd(i, ids) for i in range(entries)]
    for i in range(0, entries, 10_000):
        r.pipelined(adds[i:i + 10_000])
    r.call("XGROUP", "CREATE", "inbox", "g", "0")


def inbox_xadd(i, ids):
    own_id = ("delayq-id", "x%d" % i) if ids else ()
    return encode("XADD", "inbox", "*", "delayq-stream", "orders", "delayq-delay", "20000",
                  *own_id, "payload", "x" * 100)


def inbox_ways(ways, commands=None, emptied=False):
    """The inbox labs' command line and table: for each round and each of `ways`
    (name -> way(r, per_read), which reads the whole inbox and returns how many
    entries it read), a new inbox of ENTRIES entries (`fill_inbox`, with ids) read
    PER_READ at a time, and Redis's CPU µs an entry and each command's own µs an
    entry: of `commands`, or of every command but the lab's own (at least 0.01).
    Checks that every entry was read once, and with `emptied` that none is left."""
    entries, per_read, rounds = int_args(100_000, 400, 3)

    def work(r):
        def row(n, name, way):
            fill_inbox(r, entries, ids=True)
            r.call("CONFIG", "RESETSTAT")
            before = r.cpu_seconds()
            read = way(r, per_read)
            cpu = (r.cpu_seconds() - before) / entries * 1e6
            left = r.call("XLEN", "inbox") if emptied else 0
            if read != entries or left != 0:
                raise SystemExit("%s read %d entries of %d, left %d" % (name, read, entries, left))
            usec = {k: v / entries for k, v in sorted(commandstats_usec(r).items())}
            names = commands or [k for k, v in usec.items()
                                 if k not in ("info", "config", "script") and v >= 0.01]
            own = ", ".join("%s %.2f" % (k, usec[k]) for k in names if k in usec)
            return [str(n), name, "%.2f" % cpu, own]

        rounds_table(["round", "way", "Redis CPU µs an entry", "commands' own µs an entry"],
                     rounds, ways, row)

    with_redis(work)


def rounds_table(columns, rounds, ways, row):
    """Prints a Markdown table of `columns`: for each round (1..rounds) and each of
    `ways` (name -> what is measured), the cells `row(n, name, way)` gives."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for n in range(1, rounds + 1):
        for name, way in ways.items():
            print("| " + " | ".join(row(n, name, way)) + " |")


def commandstats_usec(r):
    """Redis's µs in each command since the last CONFIG RESETSTAT (INFO commandstats),
    by command name."""
    usec = {}
    for line in r.call("INFO", "commandstats").decode().splitlines():
        if line.startswith("cmdstat_"):
            name, stats = line[len("cmdstat_"):].split(":", 1)
            usec[name] = int(dict(kv.split("=") for kv in stats.split(","))["usec"])
    return usec


def command_usec(r, script="fcall"):
    """Redis's own µs in commands other than the script calls (`script`) and INFO,
    from INFO commandstats."""
    return sum(v for k, v in commandstats_usec(r).items() if k not in (script, "info"))


def drain(r, prelude, schedule, n=20_000, batch=1000):
    forward = open(os.path.join(LUA, "forward.lua")).read()
    load_library(r, "delayq_drain", prelude, {"drain_push": schedule, "drain_forward": forward})
    keys = shard_keys("drain", 0)

    def due_now():
        r.call("FLUSHALL")
        fill(r, "drain_push", keys, n, 1)
        time.sleep(0.01)

    def timed(label, args, counted=0):
        """Forward calls with `args` until n messages are counted in reply[counted]
        (0: forwarded), then Redis's CPU time and its commands' own, per message."""
        r.call("CONFIG", "RESETSTAT")
        before = r.cpu_seconds()
        moved = 0
        while moved < n:
            reply = r.call("FCALL", "drain_forward", len(keys), *keys, *args)
            if reply[counted] == 0:
                sys.exit("drain, %s: %d of %d, then none" % (label, moved, n))
            moved += reply[counted]
        cost = (r.cpu_seconds() - before) / moved * 1e6
        print("| drain %d due, calls of %d, %s | %.1f µs a message | Redis commands' own %.1f µs |"
              % (n, batch, label, cost, command_usec(r) / moved))

    for label, retention in (("records kept", "86400000"), ("no records", "0")):
        due_now()
        timed(label, forward_args(batch, retention))
    ceiling(r, n, batch)
    # A stream at its limit (streams.max_rate): the calls set every due message aside
    # in its held set (no permits left; reply[9] counts them), then send them from
    # there once permits allow (a budget above the batch: the limit no longer binds).
    # Records kept.
    due_now()
    timed("limited stream, set aside (no permits)",
          forward_args(batch, "86400000", [("bench:spread", 0)]), 9)
    timed("limited stream, then sent from the held set",
          forward_args(batch, "86400000", [("bench:spread", 10**9)]))


def ceiling(r, n, batch):
    """The same drain by the bench's ceiling (src/cli/bench/ceiling.lua: per message
    only the XADD, from a due set and a hash of bodies), as `delayq bench` measures
    it: what a forward call's per-message work compares with, in the same run."""
    cost = ceiling_cost(r, n, batch)
    print("| drain %d due, calls of %d, the ceiling (only the XADD a message) | %.1f µs a message "
          "| Redis commands' own %.1f µs |" % (n, batch, cost, command_usec(r, "evalsha") / n))


def ceiling_cost(r, n, batch):
    """Redis CPU µs a message for the ceiling to drain `n` due messages (see ceiling)."""
    text = open(os.path.join(ROOT, "src", "cli", "bench", "ceiling.lua")).read()
    r.call("FLUSHALL")
    sha = r.call("SCRIPT", "LOAD", text)
    keys = ["{ceiling}:due", "{ceiling}:bodies", "bench:spread"]
    body = "x" * 100
    for first in range(0, n, 1000):
        ids = ["c%d" % i for i in range(first, min(first + 1000, n))]
        r.call("ZADD", keys[0], *[x for i in ids for x in ("1", i)])
        r.call("HSET", keys[1], *[x for i in ids for x in (i, body)])
    r.call("CONFIG", "RESETSTAT")
    before = r.cpu_seconds()
    moved = 0
    while moved < n:
        got = r.call("EVALSHA", sha, len(keys), *keys, batch)
        if got == 0:
            sys.exit("drain, ceiling: %d of %d, then none" % (moved, n))
        moved += got
    return (r.cpu_seconds() - before) / moved * 1e6


if __name__ == "__main__":
    main()
