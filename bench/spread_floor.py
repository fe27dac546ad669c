#!/usr/bin/env python3
"""What spread traffic costs Redis at least, on this machine, whatever the scripts.

    python3 bench/spread_floor.py [seconds] [rounds] [due_in_ms] [pending]

Starts a redis-server of its own on a free loopback port (removed at the end) and
paces messages at a steady rate, as the spread scenario's producer does, through
seven designs, each in turn, `rounds` times side by side (default 2), for `seconds`
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
                ttl, limits, keys, expiry of records); its messages must come due
                in the order they are sent (one list)
  least sorted  the same with messages in any due order: a sorted set of ids by
                due time and a hash of their bodies (the shape of delayq's hash
                pending layout), read with one ZRANGEBYSCORE and one HMGET
  least compact the same kept lean in memory (the shape of delayq's compact
                layout): lists by due second in due order, the id index and the
                records in 2,048 hashes by the id's SHA-1, small enough to stay
                listpacks; a message that sorts before its second's last is
                inserted in place
  delayq        every tick, one call of delayq's push (schedule_batch, the compact
                layouts) with the tick's messages and one forward (forward.lua) of
                the same shard, loaded as the daemon loads them
  delayq hash   the same with both layouts "hash"

at 1,000 and 10,000 messages a second, with a producer that sends every 1 ms (what a
one-message HTTP push gives) and every 10 ms (what gathering single pushes for 10 ms
would give). Every message is due `due_in_ms` (default 500) after it is sent; no
entry has a MAXLEN. Reported: Redis's own CPU time (`INFO cpu`, user + sys, its event
loop included) per message over the measured seconds, and calls per message. Each
design's messages go to a stream of their own; the run exits unless each reached it
exactly once.

Then a burst: 20,000 messages already due in one shard, drained in calls of 1000 by
the three least designs' forwards and by the bench's ceiling (src/cli/bench/ceiling.lua,
only the XADD a message), side by side, `rounds` times: a least forward's share of
the ceiling bounds from above what a forward of its layout that keeps a record of
each delivery can reach.

    python3 bench/spread_floor.py drain [rounds] [batch] [messages]

runs only the burst, in calls of `batch` (default 200, the forwarder's batch_size),
`rounds` times (default 3), of `messages` (default 20,000): the three least designs'
forwards, the least compact one
keeping no record at all (a bound for any way of keeping records, per message or per
call), delayq's forward (forward.lua, records kept a day) in both layouts, and the
ceiling, each draining the same due messages in turn; each forward's share of its
round's ceiling. Last, each design's Redis memory and CPU time a pending
message, `rounds` times: `pending` messages (default 100,000) due in an hour, pushed
in calls of 1000 (the Redis side of a batch ingest).

Only Python's standard library; no delayq process is involved.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import script_cost as sc  # noqa: E402
from kept_apart import used_memory  # noqa: E402

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
-- A push's due time, its ids and the places in them of those neither pending (in the
-- hash KEYS[2]) nor on record (in the hash KEYS[3]), both checked in one HMGET each.
local function new_ids(KEYS, ARGV)
  local due = now_ms() + tonumber(ARGV[1])
  local ids = {}
  for i = 3, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
  local pending = redis.call('HMGET', KEYS[2], unpack(ids))
  local kept = redis.call('HMGET', KEYS[3], unpack(ids))
  local new = {}
  for k = 1, #ids do
    if not pending[k] and not kept[k] then new[#new + 1] = k end
  end
  return due, ids, new
end
-- KEYS[1] due list  KEYS[2] id index  KEYS[3] records; ARGV[1] due in (ms), ARGV[2]
-- stream, then id, payload, ...
redis.register_function('least_push', function(KEYS, ARGV)
  local due, ids, new = new_ids(KEYS, ARGV)
  local bodies, index = {}, {}
  for _, k in ipairs(new) do
    local id = ids[k]
    bodies[#bodies + 1] = cmsgpack.pack({ id, due, ARGV[2], { 'payload', ARGV[2 * k + 2] } })
    index[#index + 1] = id
    index[#index + 1] = due
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
-- The least design again, with messages in any due order: a sorted set of ids by
-- due time (then priority, here 0) and a hash of their bodies, as the hash pending
-- layout keeps them. KEYS[1] due set  KEYS[2] bodies  KEYS[3] records; ARGV as
-- least_push's.
redis.register_function('sorted_push', function(KEYS, ARGV)
  local due, ids, new = new_ids(KEYS, ARGV)
  local scores, bodies = {}, {}
  for _, k in ipairs(new) do
    local id = ids[k]
    scores[#scores + 1] = due * 10
    scores[#scores + 1] = id
    bodies[#bodies + 1] = id
    bodies[#bodies + 1] = cmsgpack.pack({ due, ARGV[2], { 'payload', ARGV[2 * k + 2] } })
  end
  if #bodies > 0 then
    redis.call('ZADD', KEYS[1], unpack(scores))
    redis.call('HSET', KEYS[2], unpack(bodies))
  end
  return #bodies / 2
end)
-- KEYS as sorted_push's, KEYS[4] fence; ARGV[1] epoch, ARGV[2] batch.
redis.register_function('sorted_forward', function(KEYS, ARGV)
  if redis.call('GET', KEYS[4]) ~= ARGV[1] then return redis.error_reply('FENCED') end
  local now = now_ms()
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now * 10 + 9, 'LIMIT', 0, tonumber(ARGV[2]))
  if #ids == 0 then return 0 end
  local bodies = redis.call('HMGET', KEYS[2], unpack(ids))
  local records = {}
  for k, id in ipairs(ids) do
    local m = cmsgpack.unpack(bodies[k])
    local fields = m[3]
    records[2 * k - 1] = id
    records[2 * k] = redis.call('XADD', m[2], '*', 'delayq-id', id, fields[1], fields[2])
  end
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('HDEL', KEYS[2], unpack(ids))
  redis.call('HSET', KEYS[3], unpack(records))
  return #ids
end)
-- The least design kept compact: messages in lists by due second (a sorted set of
-- the seconds that hold any), each element the score's text (13 digits of due ms and
-- the priority) .. the id's length .. the id .. its packed stream and fields, in
-- score order; the id index and the records as hashes in 2^11 buckets by the id's
-- SHA-1 (sized for the lab's 100,000 pending, so that each stays a listpack). No
-- bucket ever grows or splits, no record expires: the least a memory-lean layout
-- costs. KEYS[1] the seconds  KEYS[2] index prefix  KEYS[3] records prefix; ARGV as
-- least_push's. A message that sorts before its second's last is inserted in place.
local function bucket_no(id)
  return ':' .. tonumber(string.sub(redis.sha1hex(id), 1, 3), 16) % 2048
end
local function score_text(due) return string.format('%013d0', due) end
redis.register_function('compact_push', function(KEYS, ARGV)
  local due = now_ms() + tonumber(ARGV[1])
  local score, second = score_text(due), math.floor(due / 1000)
  local list = KEYS[1] .. ':' .. second
  local stored, last = 0, redis.call('LINDEX', list, -1)
  local appended = {}
  for i = 3, #ARGV, 2 do
    local id = ARGV[i]
    local b = bucket_no(id)
    local ix, rec = KEYS[2] .. b, KEYS[3] .. b
    if not redis.call('HGET', ix, id) and not redis.call('HGET', rec, id) then
      local elem = score .. string.char(#id) .. id .. cmsgpack.pack({ ARGV[2], { 'payload', ARGV[i + 1] } })
      if not last or string.sub(last, 1, 14) <= score then
        if not last then redis.call('ZADD', KEYS[1], second, second) end
        appended[#appended + 1] = elem
        last = elem
      else
        local all = redis.call('LRANGE', list, 0, -1)
        for _, e in ipairs(all) do
          if string.sub(e, 1, 14) > score then
            redis.call('LINSERT', list, 'BEFORE', e, elem)
            break
          end
        end
      end
      redis.call('HSET', ix, id, score)
      stored = stored + 1
    end
  end
  if #appended > 0 then redis.call('RPUSH', list, unpack(appended)) end
  return stored
end)
-- KEYS as compact_push's, KEYS[4] fence; ARGV[1] epoch, ARGV[2] batch, ARGV[3]
-- "none" to keep no record of a delivery (a bound for any way of keeping them).
redis.register_function('compact_forward', function(KEYS, ARGV)
  if redis.call('GET', KEYS[4]) ~= ARGV[1] then return redis.error_reply('FENCED') end
  local now_score, batch = score_text(now_ms()) .. '9', tonumber(ARGV[2])
  local n, index, records = 0, {}, {}
  local function group(groups, key, a, b)
    local g = groups[key]
    if not g then g = { 'HSET', key }; groups[key] = g end
    g[#g + 1] = a
    if b then g[#g + 1] = b end
  end
  while n < batch do
    local second = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
    if not second then break end
    local list = KEYS[1] .. ':' .. second
    local got = redis.call('LRANGE', list, 0, batch - n - 1)
    local taken = 0
    for _, e in ipairs(got) do
      if string.sub(e, 1, 14) > now_score then break end
      local len = string.byte(e, 15)
      local id = string.sub(e, 16, 15 + len)
      local m = cmsgpack.unpack(string.sub(e, 16 + len))
      local fields = m[2]
      local entry = redis.call('XADD', m[1], '*', 'delayq-id', id, fields[1], fields[2])
      taken, n = taken + 1, n + 1
      local b = bucket_no(id)
      group(index, KEYS[2] .. b, id)
      group(records, KEYS[3] .. b, id, entry)
    end
    if taken == 0 then break end
    if taken == #got and redis.call('LLEN', list) == taken then
      redis.call('DEL', list)
      redis.call('ZREM', KEYS[1], second)
    else
      redis.call('LTRIM', list, taken, -1)
      break
    end
  end
  for _, g in pairs(index) do
    g[1] = 'HDEL'
    redis.call(unpack(g))
  end
  if ARGV[3] ~= 'none' then
    for _, g in pairs(records) do redis.call(unpack(g)) end
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
    """The least design; its subclasses' functions are FLOOR's <KIND>_push and
    <KIND>_forward."""

    KIND = "least"
    KEYS = ["{least}:q", "{least}:ix", "{least}:rec", "{least}:fence"]
    FENCE = 3  # KEYS[FENCE] is the fence
    batch = 200

    def tick(self, n):
        return ([self.push(n, DUE_IN_MS)] if n else []) + [self.forward()]

    def push(self, n, due_in_ms):
        args = [str(due_in_ms), self.stream]
        for i in self.next_ids(n):
            args += [i, PAYLOAD]
        return sc.encode("FCALL", self.KIND + "_push", 3, *self.KEYS[:3], *args)

    def forward(self):
        return sc.encode("FCALL", self.KIND + "_forward", 4, *self.KEYS, "1", str(self.batch))

    def moved(self, replies, n):
        if n and replies[0] != n:
            sys.exit("%s: a push was refused: %r" % (self.name, replies[0]))
        return replies[-1]


class Sorted(Least):
    """The least design with messages in any due order (a sorted set and a hash)."""

    KIND = "sorted"
    KEYS = ["{sorted}:due", "{sorted}:bodies", "{sorted}:rec", "{sorted}:fence"]


class Compact(Least):
    """The least design kept compact (lists by due second, bucketed hashes)."""

    KIND = "compact"
    KEYS = ["{compact}:q", "{compact}:ix", "{compact}:rec", "{compact}:fence"]


class CompactUnrecorded(Compact):
    """The least compact design's forward keeping no record at all: what any way of
    keeping records (per message, per call) costs at least on top of the rest."""

    def forward(self):
        return sc.encode("FCALL", "compact_forward", 4, *self.KEYS, "1", str(self.batch), "none")


class Delayq(Design):
    KEYS = sc.shard_keys("delayq", 0)
    FENCE = 4
    LAYOUT, RECORDS = "compact", ""
    batch = 200

    def tick(self, n):
        return ([self.push(n, DUE_IN_MS)] if n else []) + [self.forward()]

    def push(self, n, due_in_ms):
        head = list(sc.HEAD)
        head[5] = self.LAYOUT
        msgs = []
        for i in self.next_ids(n):
            m = sc.message(1)
            m[3], m[5], m[9] = i, str(due_in_ms), self.stream
            msgs.append(m)
        return sc.encode("FCALL", "floor_push", len(self.KEYS), *self.KEYS, *sc.push_args(msgs, head))

    def forward(self):
        args = sc.forward_args(self.batch, 86400000)
        args[2] = self.RECORDS + args[2]
        return sc.encode("FCALL", "floor_forward", len(self.KEYS), *self.KEYS, *args)

    def moved(self, replies, n):
        if n and not sc.stored(replies[0]):
            sys.exit("%s: a push was refused: %r" % (self.name, replies[0]))
        return replies[-1][0]


class DelayqHash(Delayq):
    """delayq with both layouts "hash" (pending.layout, records.layout)."""

    KEYS = sc.shard_keys("delayqhash", 0)
    LAYOUT, RECORDS = "hash", "hash:"


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


def drains(r, rounds, batch):
    """Only the burst: each forward and the ceiling drain the same BURST due messages
    in calls of `batch`, in turn, `rounds` times; each forward's share of the
    ceiling of its own round."""
    r.call("FUNCTION", "LOAD", "REPLACE", FLOOR)
    load_delayq(r)
    kinds = [("least design", Least), ("least sorted", Sorted), ("least compact", Compact),
             ("least compact, no records", CompactUnrecorded),
             ("delayq, compact layouts", Delayq), ("delayq, hash layouts", DelayqHash)]
    print("| round | the ceiling | %s |" % " | ".join(name for name, _ in kinds))
    print("|---|---|" + "---|" * len(kinds))
    for n in range(rounds):
        cells = [least_drain(r, kind, batch) for _, kind in kinds]
        ceiling = sc.ceiling_cost(r, BURST, batch)
        print("| %d | %.2f µs | %s |" % (n + 1, ceiling, " | ".join(
            "%.2f µs (%.0f%%)" % (c, 100 * ceiling / c) for c in cells)))


def main():
    if sys.argv[1:2] == ["drain"]:
        rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
        batch = int(sys.argv[3]) if len(sys.argv) > 3 else 200
        global BURST
        BURST = int(sys.argv[4]) if len(sys.argv) > 4 else BURST
        sc.with_redis(lambda r: drains(r, rounds, batch))
        return
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    global DUE_IN_MS
    DUE_IN_MS = int(sys.argv[3]) if len(sys.argv) > 3 else DUE_IN_MS
    global PENDING
    PENDING = int(sys.argv[4]) if len(sys.argv) > 4 else PENDING
    sc.with_redis(lambda r: run(r, seconds, rounds))


def load_delayq(r):
    """delayq's push and forward as the Delayq designs call them (floor_push,
    floor_forward), loaded as the daemon loads them."""
    schedule = open(os.path.join(sc.LUA, "schedule_batch.lua")).read()
    forward = open(os.path.join(sc.LUA, "forward.lua")).read()
    sc.load_library(r, "delayq_floor", sc.prelude_text(),
                    {"floor_push": schedule, "floor_forward": forward})


def run(r, seconds, rounds):
    r.call("FUNCTION", "LOAD", "REPLACE", FLOOR)
    load_delayq(r)
    fences(r)
    designs = [Ping("ping"), Bare("bare move"), Least("least design"), Sorted("least sorted"),
               Compact("least compact"), Delayq("delayq"), DelayqHash("delayq hash")]
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
        least = least_drain(r, Least)
        least_sorted = least_drain(r, Sorted)
        least_compact = least_drain(r, Compact)
        sc.ceiling(r, BURST, 1000)
        print("| drain %d due, calls of 1000, the least design's forward | %.1f µs a message |" % (BURST, least))
        print("| the same, the least sorted design's forward | %.1f µs a message |" % least_sorted)
        print("| the same, the least compact design's forward | %.1f µs a message |" % least_compact)
    print()
    print("| %d pending, 100-byte payload, pushed in calls of 1000 | Redis memory a message | "
          "Redis CPU a message, each round |" % PENDING)
    print("|---|---|---|")
    for design in (Least("least design"), Sorted("least sorted"), Compact("least compact"), Delayq("delayq"),
                   DelayqHash("delayq hash")):
        figures = [pending_memory(r, design) for _ in range(rounds)]
        print("| %s | %.0f B | %s |" % (design.name, figures[-1][0],
                                        ", ".join("%.1f µs" % f[1] for f in figures)))


BURST = 20_000
PENDING = 100_000


def fences(r):
    for design in (Least, Sorted, Compact, Delayq, DelayqHash):
        r.call("SET", design.KEYS[design.FENCE], "1")


def pending_memory(r, design):
    """Redis's used memory and CPU µs a message for PENDING messages due in an hour,
    pushed in calls of 1000 (the stream they name is never written)."""
    r.call("FLUSHALL")
    fences(r)
    design.stream = "floor:memory"
    before, cpu = used_memory(r), r.cpu_seconds()
    per_call = min(1000, PENDING)
    for _ in range(PENDING // per_call):
        r.call_encoded(design.push(per_call, 3_600_000))
    cpu = r.cpu_seconds() - cpu
    return (used_memory(r) - before) / PENDING, cpu / PENDING * 1e6


def least_drain(r, kind, batch=1000):
    """Redis CPU µs a message for a design's forward (a least design's, or delayq's)
    to drain BURST due messages in calls of `batch`."""
    r.call("FLUSHALL")
    fences(r)
    design = kind("least drain")
    design.batch = batch
    design.stream = "floor:drain"
    for _ in range(BURST // 1000):
        r.call_encoded(design.push(1000, 0))
    time.sleep(0.01)
    forward = design.forward()
    before, moved = r.cpu_seconds(), 0
    while moved < BURST:
        got = design.moved([r.call_encoded(forward)], 0)
        if got == 0:
            sys.exit("least drain: %d of %d, then none" % (moved, BURST))
        moved += got
    cost = (r.cpu_seconds() - before) / moved * 1e6
    delivered_once(r, design.stream, BURST)
    return cost


if __name__ == "__main__":
    main()
