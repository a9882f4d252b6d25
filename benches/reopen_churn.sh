#!/usr/bin/env bash
# What reopening partition logs costs when more partitions are busy than a
# shard may keep open: the broker runs with RLIMIT_NOFILE 256 (so 16 open logs
# a shard), topic `t` has 64 partitions of about 4 MiB each, and a 10 s
# `narad bench t --mode produce` (16 workers, 200 B) spreads over all of them,
# so most commits first close another log and reopen their own.
#
# Usage: benches/reopen_churn.sh BINARY [ROUNDS]
#
# Prints per run: the bytes the broker read from its files during the bench
# (/proc/<pid>/io read_bytes), the produce rate and p99, and the logs closed
# to make room (`narad_idle_logs_evicted_total`).
set -euo pipefail

if [ $# -lt 1 ]; then
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
BIN=$1
ROUNDS=${2:-1}
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
pid=
for round in $(seq 1 "$ROUNDS"); do
    rm -rf "$work/data"
    port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
    addr=http://127.0.0.1:$port
    (ulimit -n 256; exec "$BIN" serve --dev --shards 2 --port "$port" --data-dir "$work/data" >"$work/log" 2>&1) &
    pid=$!
    until curl -sf -o /dev/null "$addr/readyz"; do sleep 0.05; done
    curl -sf -XPOST "$addr/v1/topics" -H 'content-type: application/json' \
        -d '{"name":"t","partitions":64}' >/dev/null
    python3 - "$addr" <<'PY'
import sys, json, http.client, urllib.parse
a = urllib.parse.urlparse(sys.argv[1]); c = http.client.HTTPConnection(a.hostname, a.port)
for p in range(64):
    body = json.dumps({"messages": [{"payload": "x" * 1000, "partition": p} for _ in range(100)]})
    for _ in range(40):
        c.request("POST", "/v1/topics/t/produce/batch", body, {"content-type": "application/json"})
        r = c.getresponse(); r.read(); assert r.status == 202, r.status
PY
    sleep 3
    before=$(awk '/read_bytes/{print $2}' "/proc/$pid/io")
    "$BIN" bench t -s "$addr" --mode produce --duration 10s --workers 16 --size 200 \
        --json "$work/bench.json" >/dev/null 2>&1
    after=$(awk '/read_bytes/{print $2}' "/proc/$pid/io")
    evicted=$(curl -sf "$addr/metrics" | awk '/^narad_idle_logs_evicted_total/{print $2}')
    python3 - "$work/bench.json" "$(( (after - before) / 1000000 ))" "$evicted" "$round" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"run {sys.argv[4]}: read {sys.argv[2]} MB, {int(d['rate'])} records/s, p99 {d['p99_us']} us, {sys.argv[3]} logs closed to make room")
PY
    kill -TERM "$pid"; wait "$pid" || true
done
