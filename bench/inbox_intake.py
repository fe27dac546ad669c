#!/usr/bin/env python3
"""What the inbox's intake costs Redis, an entry's reading and its leaving together:
as delayq does it, against the group read without pending entries and a list of
the reads in flight kept beside the inbox.

    python3 bench/inbox_intake.py [ENTRIES] [PER_READ] [ROUNDS]

A redis-server of its own gets ENTRIES (default 100,000) entries of an inbox's
shape and a group made at id 0; one reader then takes PER_READ (default 400) at a
time until none is left, each read followed by one script call that lets the read's
entries leave (what the schedule call does after storing their messages):

- pending entries (delayq): `XREADGROUP`; the call `XACK`s the read's ids, reads the
  group's last delivered id and pending count (`XINFO GROUPS`), the first pending
  entry when there is one (`XPENDING`), trims below it (`XTRIM MINID`) and deletes the
  last delivered entry when nothing is left pending (as `inbox_entries.forget`);
- reads in flight: `MULTI`, `HSET` of the read's name and the id it reads after into
  a hash of the reads in flight, `XREADGROUP ... NOACK`, `EXEC`; the call `HDEL`s the
  read, reads what is left in flight (`HVALS`) and trims below the least of it, or
  past the read's last entry when none is.

Prints, for each round (default 3), Redis's CPU µs an entry and each command's own
µs an entry (INFO commandstats), and checks that every entry was read once and the
inbox is empty at the end. Only Python's standard library.
"""

import script_cost as sc

PENDING_LEAVE = """
redis.call('XACK', KEYS[1], 'g', unpack(ARGV))
local last, held
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, pending, delivered
  for f = 1, #g, 2 do
    if g[f] == 'name' then name = g[f + 1]
    elseif g[f] == 'pending' then pending = g[f + 1]
    elseif g[f] == 'last-delivered-id' then delivered = g[f + 1] end
  end
  if name == 'g' then last, held = delivered, pending end
end
local first = held > 0 and redis.call('XPENDING', KEYS[1], 'g', '-', last, 1)[1]
redis.call('XTRIM', KEYS[1], 'MINID', first and first[1] or last)
if not first then redis.call('XDEL', KEYS[1], last) end
return 1
"""

IN_FLIGHT_LEAVE = """
local function before(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, bms = tonumber(ams), tonumber(bms)
  return ams < bms or (ams == bms and tonumber(aseq) < tonumber(bseq))
end
redis.call('HDEL', KEYS[2], ARGV[1])
local least
for _, after in ipairs(redis.call('HVALS', KEYS[2])) do
  if not least or before(after, least) then least = after end
end
if least then
  redis.call('XTRIM', KEYS[1], 'MINID', least)
else
  local ms, seq = string.match(ARGV[2], '^(%d+)-(%d+)$')
  redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. (tonumber(seq) + 1))
end
return 1
"""


def with_pending(r, per_read):
    sha = r.call("SCRIPT", "LOAD", PENDING_LEAVE).decode()
    read = 0
    while True:
        reply = r.call("XREADGROUP", "GROUP", "g", "c", "COUNT", per_read, "STREAMS", "inbox", ">")
        if not reply:
            return read
        ids = [e[0] for e in reply[0][1]]
        r.call("EVALSHA", sha, 1, "inbox", *ids)
        read += len(ids)


def with_reads_in_flight(r, per_read):
    sha = r.call("SCRIPT", "LOAD", IN_FLIGHT_LEAVE).decode()
    read, after, n = 0, b"0-0", 0
    while True:
        n += 1
        name = "c:%d" % n
        _, replies = r.pipelined([
            sc.encode("MULTI"),
            sc.encode("HSET", "inbox:reading", name, after),
            sc.encode("XREADGROUP", "GROUP", "g", "c", "COUNT", per_read, "NOACK",
                      "STREAMS", "inbox", ">"),
            sc.encode("EXEC"),
        ])
        got = replies[-1][1]
        if not got:
            r.call("HDEL", "inbox:reading", name)
            return read
        entries = got[0][1]
        after = entries[-1][0]
        r.call("EVALSHA", sha, 2, "inbox", "inbox:reading", name, after)
        read += len(entries)


WAYS = {"pending entries (delayq)": with_pending, "reads in flight": with_reads_in_flight}


def main():
    sc.inbox_ways(WAYS, emptied=True)


if __name__ == "__main__":
    main()
