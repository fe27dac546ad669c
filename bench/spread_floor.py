#!/usr/bin/env python3
"""What spread traffic costs Redis at least, on this machine, whatever the scripts.

    python3 bench/spread_floor.py [seconds] [rounds] [due_in_ms]

Starts a redis-server of its own on a free loopback port (removed at the end) and
paces messages at a steady rate, as the spread scenario's producer does, through
four designs, each in turn, `rounds` times side by side (default 2), for `seconds`
each (default 5, after a warm-up that fills the time ahead until messages are due):

  ping          every tick, one PING and nothing else: what waking Redis costs
  bare move     every tick, one call XADDs the tick's messages and stores nothing:
                what moving them costs when nothing is delayed at all
  least design  every tick, one push call of the tick's messages (Redis's clock, both
                duplicate checks in one HMGET each, one RPUSH of the packed bodies in
                due order, one HSET of the id index) and one forward call (a fence
                GET, the clock, LRANGEs of the first due (8, then twice as many
                while all are due), per message an unpack and an XADD, one LTRIM,
                one HDEL of the index, one HSET of every delivery record): the
                least a checked, fenced, recorded delay of one shard does, almost
                no Lua beyond its commands, none of delayq's features (priorities,
                ttl, limits, keys, expiry of records)
  delayq        every tick, one call of delayq's push (schedule_batch, the compact
                layouts) with the tick's messages and one forward (forward.lua) of
                the same shard, loaded as the daemon loads them

at 1,000 and 10,000 messages a second, with a producer that sends every 1 ms (what a
one-message HTTP push gives) and every 10 ms (what gathering single pushes for 10 ms
would give). Every message is due `due_in_ms` (default 500) after it is sent; no
entry has a MAXLEN. Reported: Redis's own CPU time (`INFO cpu`, user + sys, its event
loop included) per message over the measured seconds, and calls per message. Each
design's messages go to a stream of their own; the run exits unless each reached it
exactly once.

Then a burst: 20,000 messages already due in one shard, drained in calls of 1000 by
the least design's forward and by the bench's ceiling (src/cli/bench/ceiling.lua,
only the XADD a message), side by side, `rounds` times: the least forward's share of
the ceiling bounds from above what any forward that keeps a record of each delivery
can reach.

Only Python's standard library; no delayq process is involved.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import script_cost as sc  # noqa: E402

FLOOR = """#!lua name=spread_floor
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- KEYS[1] stream; ARGV id, payload, ...
redis.register_function('bare', function(KEYS, ARGV)
  for i = 1, #ARGV, 2 do
    redis.call('XADD', KEYS[1], '*', 'delayq-id', ARGV[i], 'payload', ARGV[i + 1])
  end
  return #ARGV / 2
end)
-- KEYS[1] due list  KEYS[2] id index  KEYS[3] records; ARGV[1] due in (ms), ARGV[2]
-- stream, then id, payload, ...
redis.register_function('least_push', function(KEYS, ARGV)
  local due = now_ms() + tonumber(ARGV[1])
  local ids = {}
  for i = 3, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
  local pending = redis.call('HMGET', KEYS[2], unpack(ids))
  local kept = redis.call('HMGET', KEYS[3], unpack(ids))
  local bodies, index = {}, {}
  for k, id in ipairs(ids) do
    if not pending[k] and not kept[k] then
      bodies[#bodies + 1] = cmsgpack.pack({ id, due, ARGV[2], { 'payload', ARGV[2 * k + 2] } })
      index[#index + 1] = id
      index[#index + 1] = due
    end
  end
  if #bodies > 0 then
    redis.call('RPUSH', KEYS[1], unpack(bodies))
    redis.call('HSET', KEYS[2], unpack(index))
  end
  return #bodies
end)
-- KEYS as least_push's, KEYS[4] fence; ARGV[1] epoch, ARGV[2] batch. The due list is
-- read 8 at a time, then twice as many while all are due, up to the batch.
redis.register_function('least_forward', function(KEYS, ARGV)
  if redis.call('GET', KEYS[4]) ~= ARGV[1] then return redis.error_reply('FENCED') end
  local now, batch = now_ms(), tonumber(ARGV[2])
  local n, ids, records, want = 0, {}, {}, 8
  while n < batch do
    want = math.min(want, batch - n)
    local got = redis.call('LRANGE', KEYS[1], n, n + want - 1)
    for _, raw in ipairs(got) do
      local m = cmsgpack.unpack(raw)
      if m[2] > now then
        got = nil
        break
      end
      local fields = m[4]
      local entry = redis.call('XADD', m[3], '*', 'delayq-id', m[1], fields[1], fields[2])
      n = n + 1
      ids[n] = m[1]
      records[2 * n - 1] = m[1]
      records[2 * n] = entry
    end
    if not got or #got < want then break end
    want = want * 2
  end
  if n > 0 then
    redis.call('LTRIM', KEYS[1], n, -1)
    redis.call('HDEL', KEYS[2], unpack(ids))
    redis.call('HSET', KEYS[3], unpack(records))
  end
  return n
end)
"""

PAYLOAD = "x" * 100
DUE_IN_MS = 500


class Design:
    """One design's calls for a tick's messages, into the stream it is given."""

    writes = True

    def __init__(self, name):
        self.name = name
        self.ids = iter(range(10**9))
        self.stream = None

    def next_ids(self, n):
        return ["%s%d" % (self.name[0], next(self.ids)) for _ in range(n)]


class Ping(Design):
    writes = False

    def tick(self, n):
        return [sc.encode("PING")] if n else []

    def forward(self):
        return None

    def moved(self, replies, n):
        return n


class Bare(Design):
    def tick(self, n):
        if n == 0:
            return []
        args = []
        for i in self.next_ids(n):
            args += [i, PAYLOAD]
        return [sc.encode("FCALL", "bare", 1, self.stream, *args)]

    def forward(self):
        return None

    def moved(self, replies, n):
        return sum(replies)


class Least(Design):
    KEYS = ["{least}:q", "{least}:ix", "{least}:rec", "{least}:fence"]
    batch = 200

    def tick(self, n):
        return ([self.push(n, DUE_IN_MS)] if n else []) + [self.forward()]

    def push(self, n, due_in_ms):
        args = [str(due_in_ms), self.stream]
        for i in self.next_ids(n):
            args += [i, PAYLOAD]
        return sc.encode("FCALL", "least_push", 3, *self.KEYS[:3], *args)

    def forward(self):
        return sc.encode("FCALL", "least_forward", 4, *self.KEYS, "1", str(self.batch))

    def moved(self, replies, n):
        if n and replies[0] != n:
            sys.exit("%s: a push was refused: %r" % (self.name, replies[0]))
        return replies[-1]


class Delayq(Design):
    KEYS = sc.shard_keys("delayq", 0)

    def tick(self, n):
        out = []
        if n:
            args = list(sc.HEAD)
            for i in self.next_ids(n):
                m = sc.message(1)
                m[3], m[5], m[9] = i, str(DUE_IN_MS), self.stream
                args += m
            out.append(sc.encode("FCALL", "floor_push", len(self.KEYS), *self.KEYS, *args))
        return out + [self.forward()]

    def forward(self):
        return sc.encode("FCALL", "floor_forward", len(self.KEYS), *self.KEYS, *sc.forward_args(200, 86400000))

    def moved(self, replies, n):
        if n and not (isinstance(replies[0], list) and replies[0][0] == b"scheduled"):
            sys.exit("%s: a push was refused: %r" % (self.name, replies[0]))
        return replies[-1][0]


def pace(r, design, rate, tick_s, seconds):
    """Sends `rate` messages a second for `seconds`, a call of what has come due every
    `tick_s` (and a forward); returns (messages sent, messages moved, script calls)."""
    sent = moved = calls = 0
    start = time.perf_counter()
    next_tick = start
    while time.perf_counter() - start < seconds:
        n = int((time.perf_counter() - start) * rate) - sent
        commands = design.tick(n)
        if commands:
            r.sock.sendall(b"".join(commands))
            moved += design.moved([r.read() for _ in commands], n)
        calls += len(commands)
        sent += n
        next_tick += tick_s
        pause = next_tick - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    return sent, moved, calls


def drain(r, design, left):
    """Forwards the `left` messages still pending (due within DUE_IN_MS of being
    sent); exits if they are not all moved within a second more."""
    deadline = time.time() + DUE_IN_MS / 1000 + 1
    forward = design.forward()
    while left > 0 and forward:
        if time.time() > deadline:
            sys.exit("%s: %d messages never forwarded" % (design.name, left))
        left -= design.moved([r.call_encoded(forward)], 0)
        time.sleep(0.001)


def delivered_once(r, stream, sent):
    """Exits unless `stream` holds each of the `sent` ids exactly once."""
    seen, start = [], "-"
    while True:
        page = r.call("XRANGE", stream, start, "+", "COUNT", 10000)
        for entry_id, fields in page:
            seen.append(dict(zip(fields[::2], fields[1::2]))[b"delayq-id"])
        if len(page) < 10000:
            break
        start = "(" + page[-1][0].decode()
    if len(seen) != sent or len(set(seen)) != sent:
        sys.exit("%s: %d sent, %d entries, %d distinct" % (stream, sent, len(seen), len(set(seen))))
    r.call("DEL", stream)


streams = iter(range(10**9))


def measure(r, design, rate, tick_s, seconds):
    design.stream = "floor:%s:%d" % (design.name.split()[0], next(streams))
    # The warm-up fills the time ahead, so that forwards move what pushes add.
    warm_sent, warm_moved, _ = pace(r, design, rate, tick_s, DUE_IN_MS / 1000 + 0.2)
    cpu = r.cpu_seconds()
    sent, moved, calls = pace(r, design, rate, tick_s, seconds)
    cpu = r.cpu_seconds() - cpu
    drain(r, design, warm_sent + sent - warm_moved - moved)
    if design.writes:
        delivered_once(r, design.stream, warm_sent + sent)
    return cpu / sent * 1e6, calls / sent


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    global DUE_IN_MS
    DUE_IN_MS = int(sys.argv[3]) if len(sys.argv) > 3 else DUE_IN_MS
    sc.with_redis(lambda r: run(r, seconds, rounds))


def run(r, seconds, rounds):
    r.call("FUNCTION", "LOAD", "REPLACE", FLOOR)
    schedule = open(os.path.join(sc.LUA, "schedule_batch.lua")).read()
    forward = open(os.path.join(sc.LUA, "forward.lua")).read()
    sc.load_library(r, "delayq_floor", sc.prelude_text(),
                    {"floor_push": schedule, "floor_forward": forward})
    r.call("SET", "{least}:fence", "1")
    r.call("SET", Delayq.KEYS[4], "1")
    designs = [Ping("ping"), Bare("bare move"), Least("least design"), Delayq("delayq")]
    settings = [(rate, tick) for rate in (1000, 10000) for tick in (0.001, 0.01)]
    figures = {}
    for _ in range(rounds):
        for rate, tick in settings:
            for design in designs:
                figures.setdefault((design.name, rate, tick), []).append(
                    measure(r, design, rate, tick, seconds))
    print("Redis CPU µs a message (script calls a message), each round; 0 lost, 0 repeated")
    print()
    print("| design | %s |" % " | ".join("%d msg/s, sent every %d ms" % (rate, tick * 1000)
                                         for rate, tick in settings))
    print("|---|" + "---|" * len(settings))
    for design in designs:
        cells = []
        for rate, tick in settings:
            cells.append(", ".join("%.1f (%.2f)" % f for f in figures[(design.name, rate, tick)]))
        print("| %s | %s |" % (design.name, " | ".join(cells)))
    print()
    for _ in range(rounds):
        least = least_drain(r)
        sc.ceiling(r, BURST, 1000)
        print("| drain %d due, calls of 1000, the least design's forward | %.1f µs a message |" % (BURST, least))


BURST = 20_000


def least_drain(r):
    """Redis CPU µs a message for the least forward to drain BURST due messages."""
    r.call("FLUSHALL")
    r.call("SET", "{least}:fence", "1")
    design = Least("least drain")
    design.batch = 1000
    design.stream = "floor:drain"
    for _ in range(BURST // 1000):
        r.call_encoded(design.push(1000, 0))
    time.sleep(0.01)
    forward = design.forward()
    before, moved = r.cpu_seconds(), 0
    while moved < BURST:
        got = r.call_encoded(forward)
        if got == 0:
            sys.exit("least drain: %d of %d, then none" % (moved, BURST))
        moved += got
    cost = (r.cpu_seconds() - before) / moved * 1e6
    delivered_once(r, design.stream, BURST)
    return cost


if __name__ == "__main__":
    main()
