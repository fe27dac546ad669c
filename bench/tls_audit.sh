#!/usr/bin/env bash
# What HTTPS and the audit trail cost the daemon, on this machine: its own CPU time
# (utime + stime from /proc) per request over HTTPS and HTTP, on one kept-alive
# connection and with a new connection each; then, with the audit trail on, the
# Redis time of each recorded action (XADD to <prefix>:audit) and an admin action's
# time over HTTP. Starts its own Redis and two delayq (target/release/delayq) on
# loopback ports in a temp dir; the certificate is RSA-2048, made with openssl.
#   bench/tls_audit.sh [rounds]   (default 3)
set -euo pipefail
ROUNDS=${1:-3}
BIN=${DELAYQ_BIN:-target/release/delayq}
DIR=$(mktemp -d /tmp/delayq-tls-bench.XXXXXX)
PIDS=()
cleanup() { set +e; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; sleep 0.3; rm -rf "$DIR"; }
trap 'cleanup; true' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 300); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 not up" >&2; exit 1; }

openssl req -x509 -newkey rsa:2048 -nodes -keyout "$DIR/ca-key.pem" -out "$DIR/ca.pem" -days 2 -subj "/CN=bench-ca" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$DIR/key.pem" -out "$DIR/req.pem" -subj "/CN=localhost" 2>/dev/null
printf "subjectAltName=DNS:localhost,IP:127.0.0.1\n" > "$DIR/ext"
openssl x509 -req -in "$DIR/req.pem" -CA "$DIR/ca.pem" -CAkey "$DIR/ca-key.pem" -CAcreateserial \
  -out "$DIR/cert.pem" -days 2 -extfile "$DIR/ext" 2>/dev/null

RPORT=$(port); redis-server --port "$RPORT" --save "" --appendonly no --dir "$DIR" > "$DIR/redis.log" 2>&1 & PIDS+=($!)
TPORT=$(port); PPORT=$(port)
daemon() { # name port extra
  printf '[node]\nid = "%s"\n[redis]\nurl = "redis://127.0.0.1:%s"\nprefix = "%s"\n[api]\nlisten = "127.0.0.1:%s"\ntokens = ["bench-admin-token"]\n%s\n' \
    "$1" "$RPORT" "$1" "$2" "$3" > "$DIR/$1.toml"
  "$BIN" run --config "$DIR/$1.toml" > "$DIR/$1.log" 2>&1 & PIDS+=($!)
}
wait_port "$RPORT"
daemon tls "$TPORT" "tls = { cert_file = \"$DIR/cert.pem\", key_file = \"$DIR/key.pem\" }"; T=${PIDS[-1]}
daemon plain "$PPORT" ""; P=${PIDS[-1]}
wait_port "$TPORT"; wait_port "$PPORT"

cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
urls() { for _ in $(seq "$2"); do printf '%s ' "$1"; done; }
for round in $(seq "$ROUNDS"); do
  for pair in "$T https://localhost:$TPORT/healthz" "$P http://127.0.0.1:$PPORT/healthz"; do
    set -- $pair
    c0=$(cpu "$1"); s=$(date +%s%N)
    # shellcheck disable=SC2046
    curl -s --cacert "$DIR/ca.pem" $(urls "$2" 5000) > /dev/null
    e=$(date +%s%N); c1=$(cpu "$1")
    echo "round $round  ${2%%:*}  kept alive:     wall $(( (e-s)/5000000 )) us/request, daemon cpu $(( (c1-c0)*1000000/TICK/5000 )) us/request"
    c0=$(cpu "$1"); s=$(date +%s%N)
    for _ in $(seq 300); do curl -s --cacert "$DIR/ca.pem" -o /dev/null "$2"; done
    e=$(date +%s%N); c1=$(cpu "$1")
    echo "round $round  ${2%%:*}  new connection: wall $(( (e-s)/300000 )) us/request, daemon cpu $(( (c1-c0)*1000000/TICK/300 )) us/request"
  done
done

# The audit trail: 300 pauses (each recorded), then Redis's own time per XADD.
redis-cli -p "$RPORT" CONFIG RESETSTAT > /dev/null
s=$(date +%s%N)
# shellcheck disable=SC2046
curl -s -H "Authorization: Bearer bench-admin-token" -H "content-type: application/json" -X POST -d '{}' \
  $(for i in $(seq 300); do printf 'http://127.0.0.1:%s/v1/streams/s%d/pause ' "$PPORT" "$i"; done) > /dev/null
e=$(date +%s%N)
echo "audited pause over HTTP: $(( (e-s)/300000 )) us each (300, one connection)"
redis-cli -p "$RPORT" INFO commandstats | grep -E '^cmdstat_(xadd|sadd):' | tr -d '\r'
echo "recorded: $(redis-cli -p "$RPORT" XLEN plain:audit) entries"
