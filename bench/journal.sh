#!/usr/bin/env bash
# The journal's cost and restore rate, on this machine: HTTP batch ingest with the
# journal off, on without its transition log and on; the journal's rows and bytes
# per message and step; the Redis time of forwarding without and with the log; a
# restore of every message after a FLUSHALL. Starts its own
# Redis, MariaDB and delayq (target/release/delayq) on loopback ports in a temp dir.
#   bench/journal.sh [messages]   (default 200000)
# ROUNDS (default 3): rounds of the journal without and with its transition log,
# alternated; NO_BENCH=1 skips `delayq bench`'s ingest scenarios at the end.
set -euo pipefail
N=${1:-200000}
BIN=${DELAYQ_BIN:-target/release/delayq}
DIR=$(mktemp -d /tmp/delayq-journal-bench.XXXXXX)
PIDS=()
cleanup() { set +e; for f in "$DIR"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.5; [ -n "${KEEP:-}" ] || rm -rf "$DIR"; }
trap 'cleanup; true' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 300); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 not up" >&2; exit 1; }

RPORT=$(port); redis-server --port "$RPORT" --save "" --appendonly no --dir "$DIR" --daemonize no > "$DIR/redis.log" 2>&1 & PIDS+=($!)
MPORT=$(port)
mkdir -p "$DIR/dbtmp"
mariadb-install-db --no-defaults --datadir="$DIR/db" --tmpdir="$DIR/dbtmp" --user=root --auth-root-authentication-method=normal --skip-test-db > "$DIR/install.log" 2>&1
/usr/sbin/mariadbd --no-defaults --datadir="$DIR/db" --tmpdir="$DIR/dbtmp" --socket="$DIR/db/s.sock" --pid-file="$DIR/db/p.pid" \
  --log-error="$DIR/db/error.log" --port="$MPORT" --user=root --bind-address=127.0.0.1 --skip-name-resolve \
  --skip-log-bin --innodb-buffer-pool-size=512M & PIDS+=($!)
wait_port "$RPORT"; wait_port "$MPORT"
sql() { mariadb --no-defaults --socket="$DIR/db/s.sock" -uroot --batch --skip-column-names -e "$1"; }
sql "CREATE DATABASE delayq; CREATE USER 'delayq'@'%' IDENTIFIED BY 'pw'; GRANT ALL ON delayq.* TO 'delayq'@'%';"

# push PORT TAG [DELAY]: N messages, 1000 per HTTP batch, 4 clients at once, due
# after DELAY (default an hour); prints msg/s.
push() {
  python3 - "$1" "$N" "$2" "${3:-1h}" <<'PY'
import http.client, json, sys, threading, time
port, n, tag, delay = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
per, clients = 1000, 4
def run(k):
    c = http.client.HTTPConnection("127.0.0.1", port)
    for b in range(k, n // per, clients):
        msgs = [{"id": f"{tag}{b * per + i}", "stream": "bench", "payload": "x" * 100, "delay": delay} for i in range(per)]
        c.request("POST", "/v1/messages/batch", json.dumps({"messages": msgs}), {"Content-Type": "application/json"})
        r = c.getresponse(); body = json.loads(r.read())
        assert r.status == 200 and body["scheduled"] == per, body
t = time.time()
ts = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
[x.start() for x in ts]; [x.join() for x in ts]
print(f"{n / (time.time() - t):.0f}")
PY
}
# server_cpu NAME: CPU seconds so far of Redis, MariaDB and delayq node NAME.
server_cpu() {
  local pids=("${PIDS[@]}" "$(cat "$DIR/$1.pid")")
  python3 -c '
import os, sys
tick = os.sysconf("SC_CLK_TCK")
total = 0
for pid in sys.argv[1:]:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    except OSError:
        pass
print(total / tick)' "${pids[@]}"
}
node() { # node NAME EXTRA-TOML: starts delayq, prints its API port
  local p; p=$(port)
  printf '[node]\nid = "%s"\n[api]\nlisten = "127.0.0.1:%s"\n[redis]\nurl = "redis://127.0.0.1:%s"\n%b' "$1" "$p" "$RPORT" "$2" > "$DIR/$1.toml"
  "$BIN" run --config "$DIR/$1.toml" > "$DIR/$1.log" 2>&1 &
  echo $! > "$DIR/$1.pid"
  wait_port "$p"; echo "$p"
}
JOURNAL="[journal]\nurl = \"mysql://delayq:pw@127.0.0.1:$MPORT/delayq\"\n"

P=$(node off "")
OFF=$(push "$P" off)
kill "$(cat "$DIR/off.pid")"; sleep 1
# forward_cost PORT TAG: N more messages due together once pushed, then Redis's CPU
# time and its script calls' time while they are forwarded and journaled as
# delivered, per message; prints "<cpu us> <script us>".
forward_cost() {
  push "$1" "$2" "$(( N / 4000 > 15 ? N / 4000 : 15 ))s" > /dev/null
  redis-cli -p "$RPORT" CONFIG RESETSTAT > /dev/null
  local cpu0; cpu0=$(redis-cli -p "$RPORT" INFO cpu | python3 -c 'import sys; d=dict(l.strip().split(":",1) for l in sys.stdin if ":" in l); print(float(d["used_cpu_sys"]) + float(d["used_cpu_user"]))')
  for _ in $(seq 1200); do
    [ "$(sql "SELECT COUNT(*) FROM delayq.delayq_messages WHERE state = 1 AND id LIKE '$2%'")" -ge "$N" ] && break; sleep 0.1
  done
  redis-cli -p "$RPORT" INFO all | python3 -c '
import sys
d = dict(l.strip().split(":", 1) for l in sys.stdin if ":" in l)
cpu = float(d["used_cpu_sys"]) + float(d["used_cpu_user"]) - float(sys.argv[1])
fcall = sum(int(dict(kv.split("=") for kv in d[k].split(","))["usec"]) for k in ("cmdstat_fcall", "cmdstat_fcall_ro") if k in d)
n = int(sys.argv[2])
print(f"{cpu * 1e6 / n:.1f} {fcall / n:.1f}")' "$cpu0" "$N"
}
# The journal without its transition log (journal.transitions = false), then with,
# alternated ROUNDS times (default 3) on emptied tables and an emptied Redis: each
# round's ingest, then the Redis time of forwarding N messages and journaling them.
PLAINS=(); ONS=(); PLAIN_CPU=(); ON_CPU=(); PLAIN_FWD=(); ON_FWD=()
for round in $(seq "${ROUNDS:-3}"); do
  for mode in plain on; do
    redis-cli -p "$RPORT" FLUSHALL > /dev/null
    # (The first daemon creates the tables.)
    [ "$round$mode" = 1plain ] || sql "TRUNCATE TABLE delayq.delayq_messages; TRUNCATE TABLE delayq.delayq_transitions"
    extra=""; [ "$mode" = plain ] && extra="transitions = false\n"
    P=$(node "$mode$round" "${JOURNAL}$extra")
    cpu0=$(server_cpu "$mode$round")
    rate=$(push "$P" "$mode$round")
    cpu=$(python3 -c "print(f'{($(server_cpu "$mode$round") - $cpu0) * 1e6 / $N:.1f}')")
    if [ "$round" = "${ROUNDS:-3}" ]; then
      # The journal of N pushed messages (with the log, each push's step in its row).
      ROWS=$(sql "SELECT COUNT(*) FROM delayq.delayq_messages")
      sql "ANALYZE TABLE delayq.delayq_messages" > /dev/null
      BYTES=$(sql "SELECT data_length + index_length FROM information_schema.TABLES WHERE table_schema = 'delayq' AND table_name = 'delayq_messages'")
      [ "$mode" = plain ] && PLAIN_BYTES=$BYTES
    fi
    fwd=$(forward_cost "$P" "f$mode$round")
    if [ "$round" = "${ROUNDS:-3}" ] && [ "$mode" = on ]; then
      # The log of N more messages forwarded: their pushes and forwards.
      STEPS=$(sql "SELECT COUNT(*) FROM delayq.delayq_transitions")
      sql "ANALYZE TABLE delayq.delayq_transitions" > /dev/null
      STEP_BYTES=$(sql "SELECT data_length + index_length FROM information_schema.TABLES WHERE table_schema = 'delayq' AND table_name = 'delayq_transitions'")
    fi
    if [ "$mode" = plain ]; then PLAINS+=("$rate"); PLAIN_CPU+=("$cpu"); PLAIN_FWD+=("$fwd")
    else ONS+=("$rate"); ON_CPU+=("$cpu"); ON_FWD+=("$fwd"); fi
    [ "$round" = "${ROUNDS:-3}" ] && [ "$mode" = on ] && break
    kill "$(cat "$DIR/$mode$round.pid")"; sleep 1
  done
done
# What follows goes on with the last round's daemon, the log on.
# Deliveries journaled: N more messages due at once; the lag histogram's p99.
push "$P" now 0ms > /dev/null
for _ in $(seq 600); do
  [ "$(sql "SELECT COUNT(*) FROM delayq.delayq_messages WHERE state = 1 AND id LIKE 'now%'")" -ge "$N" ] && break; sleep 0.1
done
LAG=$(curl -s "127.0.0.1:$P/metrics" | python3 -c '
import sys
b = [(float(l.split("le=\"")[1].split("\"")[0].replace("+Inf", "inf")), float(l.split()[-1]))
     for l in sys.stdin if l.startswith("delayq_journal_lag_seconds_bucket")]
total = b[-1][1]
print(next(le for le, n in b if n >= 0.99 * total))')
sql "DELETE FROM delayq.delayq_messages WHERE state = 1" > /dev/null
# Restore is measured on a journal at rest: InnoDB purges the deleted rows in the
# background first (up to two minutes), which would otherwise compete for the CPU.
for _ in $(seq 1200); do
  [ "$(sql "SHOW ENGINE INNODB STATUS" | grep -o 'History list length [0-9]*' | grep -o '[0-9]*$')" -lt 1000 ] && break; sleep 0.1
done
kill "$(cat "$DIR/on${ROUNDS:-3}.pid")"; sleep 1
redis-cli -p "$RPORT" FLUSHALL > /dev/null
printf '[redis]\nurl = "redis://127.0.0.1:%s"\n%b' "$RPORT" "$JOURNAL" > "$DIR/restore.toml"
# restore: FLUSHALL, then a timed `delayq restore`; prints "<restored> <seconds>".
restore() {
  redis-cli -p "$RPORT" FLUSHALL > /dev/null
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN" restore --config "$DIR/restore.toml" --json > "$DIR/restore.json"
  t1=$(date +%s.%N)
  python3 -c "import json; print(json.load(open('$DIR/restore.json'))['restored'], $t1 - $t0)"
}
# Twice: first with the journal's pages as the deliveries above left InnoDB's buffer
# pool (most of them evicted by the other million rows), then with them cached.
read -r COLD_N COLD_S < <(restore)
read -r WARM_N WARM_S < <(restore)
echo "messages: $N (100-byte payload, HTTP batches of 1000, 4 clients)"
echo "ingest, journal off: $OFF msg/s"
echo "ingest, journal on without its transition log, round by round: ${PLAINS[*]} msg/s"
echo "ingest, journal on, round by round:                              ${ONS[*]} msg/s"
python3 -c "
import statistics as s, sys
a, b = [float(x) for x in sys.argv[1].split()], [float(x) for x in sys.argv[2].split()]
print(f'ingest medians: {s.median(a):.0f} without the log, {s.median(b):.0f} with it ({(s.median(b) / s.median(a) - 1) * 100:+.1f}%)')" "${PLAINS[*]}" "${ONS[*]}"
echo "ingest CPU of Redis, MariaDB and delayq, us a message, round by round: ${PLAIN_CPU[*]} without the log, ${ON_CPU[*]} with it"
python3 -c "
import statistics as s, sys
a, b = [float(x) for x in sys.argv[1].split()], [float(x) for x in sys.argv[2].split()]
print(f'ingest CPU medians: {s.median(a):.1f} us without the log, {s.median(b):.1f} us with it ({(s.median(b) / s.median(a) - 1) * 100:+.1f}%)')" "${PLAIN_CPU[*]}" "${ON_CPU[*]}"
echo "forwarding and journaling $N due together, Redis CPU us / script us a message, round by round:"
echo "  without the log: ${PLAIN_FWD[*]}"
echo "  with the log:    ${ON_FWD[*]}"
echo "transition log: $STEPS rows, $(( STEP_BYTES / STEPS )) bytes per step (data + indexes, InnoDB)"
echo "journal: $ROWS rows, $(( BYTES / ROWS )) bytes per message with the log, $(( PLAIN_BYTES / ROWS )) without it (data + indexes, InnoDB)"
echo "delivery-journal lag p99 (change in Redis to commit in MySQL, $N deliveries): <= $LAG s"
python3 -c "print(f'restore after FLUSHALL, journal pages cold: {$COLD_N} messages in {$COLD_S:.2f} s = {$COLD_N / $COLD_S:.0f} msg/s')"
python3 -c "print(f'restore after FLUSHALL, journal pages cached: {$WARM_N} messages in {$WARM_S:.2f} s = {$WARM_N / $WARM_S:.0f} msg/s')"

[ -n "${NO_BENCH:-}" ] && exit 0
# delayq bench's ingest scenarios (single HTTP pushes, batch HTTP, inbox), with
# the journal off and on, on a Redis of their own.
INGEST=$(( N < 100000 ? N : 100000 ))
ONLY=(--ingest "$INGEST" --burst 0 --rate 0 --backlog 0 --catchup 0 --leaders 0 --cluster 0 --no-peer --no-ceiling --no-failover)
for journal in off on; do
  extra=()
  [ "$journal" = on ] && extra=(--journal-url "mysql://delayq:pw@127.0.0.1:$MPORT/delayq")
  "$BIN" bench "${ONLY[@]}" "${extra[@]}" --out "$DIR/bench-$journal" > "$DIR/bench-$journal.txt" 2>&1
  echo "delayq bench --ingest $INGEST, journal $journal:"
  grep -E "^\| ingest-" "$DIR/bench-$journal/results.md" | sed 's/^/  /' || cat "$DIR/bench-$journal.txt"
done
