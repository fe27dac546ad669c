#!/usr/bin/env python3
"""What reading the inbox costs Redis: through the consumer group (XREADGROUP,
whose pending entries an XACK then takes away), through the group without pending
entries (XREADGROUP NOACK: the group's last delivered id is the readers' shared
cursor), and XREAD from a cursor of the reader's own (no group, nothing pending).

    python3 bench/inbox_read.py [ENTRIES] [PER_READ] [ROUNDS]

A redis-server of its own gets ENTRIES (default 100,000) entries of an inbox's
shape (a target stream, a delay, an id, a 100-byte payload) and a group made at id
0; a reader then reads PER_READ (default 400) at a time, one way or the other,
until none is left: `XREADGROUP` and one `XACK` of the read's ids, `XREADGROUP
NOACK`, or `XREAD` after the last id read. Prints, for each round (default 3), Redis's CPU µs an
entry for the reads and acknowledgements, and each command's own µs an entry
(INFO commandstats). Only Python's standard library.
"""

import script_cost as sc


def through_group(r, per_read):
    read = 0
    while True:
        reply = r.call("XREADGROUP", "GROUP", "g", "c", "COUNT", per_read, "STREAMS", "inbox", ">")
        if not reply:
            return read
        ids = [e[0] for e in reply[0][1]]
        r.call("XACK", "inbox", "g", *ids)
        read += len(ids)


def without_pending(r, per_read):
    read = 0
    while True:
        reply = r.call("XREADGROUP", "GROUP", "g", "c", "COUNT", per_read, "NOACK",
                       "STREAMS", "inbox", ">")
        if not reply:
            return read
        read += len(reply[0][1])


def from_cursor(r, per_read):
    read, cursor = 0, "0"
    while True:
        reply = r.call("XREAD", "COUNT", per_read, "STREAMS", "inbox", cursor)
        if not reply:
            return read
        entries = reply[0][1]
        cursor = entries[-1][0]
        read += len(entries)


WAYS = {
    "XREADGROUP + XACK": through_group,
    "XREADGROUP NOACK": without_pending,
    "XREAD from a cursor": from_cursor,
}


def main():
    sc.inbox_ways(WAYS, commands=("xreadgroup", "xack", "xread"))


if __name__ == "__main__":
    main()
