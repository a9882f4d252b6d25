#!/usr/bin/env bash
# Compares two broker builds on one workload, alternating them so that a noisy
# machine hurts both alike: the figure to read is broker CPU per message in a
# steady window, which moves less with the noise than the rate does.
#
# Usage:
#   benches/ab.sh OLD_BINARY NEW_BINARY ROUNDS [narad bench flags...]
#   PREFILL=10 benches/ab.sh old new 3 --mode consume --consumers 64 --max 100
#   BROKER_CONFIG=off.json benches/ab.sh old new 3 --batch 100   # broker --config
#
# Each run starts a fresh broker (one shard pinned to CPU 0, a data directory of
# its own), creates topic `t` with 6 partitions and fills it for PREFILL seconds
# (default 1) with 100-record batches of 1 KiB, then runs `narad bench t` with
# the flags given, pinned to CPU 1, for 6 s. Over a 4 s window from the first
# second it reads the messages counted in `/metrics` (consumed when anything was
# consumed, produced otherwise), the broker's CPU time from /proc/<pid>/stat,
# and the writes and reads the data directory's device completed and the bytes
# it wrote, from /proc/diskstats (the whole device: anything else writing to it
# counts too; flushes count as writes on some kernels), the last over the
# payload bytes produced (`narad_bytes_produced_total`): the write
# amplification. Prints one line per run, then each build's medians.
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
OLD=$1
NEW=$2
ROUNDS=$3
shift 3
PREFILL=${PREFILL:-1}
WORK=$(mktemp -d -t narad-ab-XXXXXX)
# The processes this script started and has not ended yet.
BROKER=
BENCH=
cleanup() {
    for pid in $BENCH $BROKER; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

counted() {
    # produced and consumed message totals and produced payload bytes, from
    # the broker's /metrics
    curl -s "$1/metrics" | awk '
        /^narad_messages_produced_total/ { p += $NF }
        /^narad_messages_consumed_total/ { c += $NF }
        /^narad_bytes_produced_total/ { b += $NF }
        END { printf "%.0f %.0f %.0f\n", p, c, b }'
}

cpu_ticks() {
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# The block device holding the work directory, as /proc/diskstats names it
# (empty on a file system without one, such as tmpfs: then no counts).
DEVICE=$(awk -v mm="$(stat -c '%Hd %Ld' "$WORK")" '$1 " " $2 == mm { print $3 }' /proc/diskstats)

disk_ops() {
    # writes and reads completed by $DEVICE so far, and sectors written
    awk -v d="$DEVICE" '$3 == d { w = $8; r = $4; s = $10 } END { printf "%.0f %.0f %.0f\n", w, r, s }' /proc/diskstats
}

run_once() {
    local binary=$1 dir="$WORK/run"
    shift
    rm -rf "$dir"
    mkdir -p "$dir"
    NARAD_HTTP_MAX_CONSUME_IN_FLIGHT_PER_IDENTITY=100000 taskset -c 0 "$binary" serve --dev \
        --port 0 --shards 1 --data-dir "$dir/data" --log-format text \
        ${BROKER_CONFIG:+--config "$BROKER_CONFIG"} > "$dir/log" 2>&1 &
    BROKER=$!
    local addr= ready=
    for _ in $(seq 100); do
        addr=$(grep -o 'addr=[0-9.:]*' "$dir/log" | head -1 | cut -d= -f2 || true)
        if [ -n "$addr" ] && curl -sf "http://$addr/readyz" > /dev/null; then
            ready=1
            break
        fi
        sleep 0.1
    done
    [ -n "$ready" ] || { echo "broker did not become ready: $(tail -3 "$dir/log")" >&2; exit 1; }
    local url="http://$addr"
    "$binary" bench -s "$url" t --create --partitions 6 --duration "$PREFILL" --cpus 1 \
        --workers 8 --batch 100 --size 1024 > /dev/null 2>&1
    "$binary" bench -s "$url" t --cpus 1 --duration 6 "$@" > "$dir/bench" 2>&1 &
    BENCH=$!
    sleep 1
    local before ticks_before disk_before after ticks_after disk_after
    before=$(counted "$url")
    ticks_before=$(cpu_ticks "$BROKER")
    disk_before=$(disk_ops)
    sleep 4
    after=$(counted "$url")
    ticks_after=$(cpu_ticks "$BROKER")
    disk_after=$(disk_ops)
    wait "$BENCH" || true
    BENCH=
    kill "$BROKER" 2>/dev/null || true
    wait "$BROKER" 2>/dev/null || true
    BROKER=
    python3 - "$before" "$after" "$((ticks_after - ticks_before))" "$(getconf CLK_TCK)" \
        "$disk_before" "$disk_after" > "$WORK/result" <<'EOF'
import sys
(p0, c0, b0), (p1, c1, b1) = (map(int, s.split()) for s in sys.argv[1:3])
ticks, hz = int(sys.argv[3]), int(sys.argv[4])
(w0, r0, s0), (w1, r1, s1) = (map(int, s.split()) for s in sys.argv[5:7])
messages = c1 - c0 if c1 > c0 else p1 - p0
if messages <= 0:
    sys.exit("no message was counted in the window")
# Device bytes written per payload byte produced (0 when nothing was produced).
amplification = (s1 - s0) * 512 / (b1 - b0) if b1 > b0 else 0.0
print(f"{messages / 4:.0f} {ticks / hz / messages * 1e6:.2f} "
      f"{(w1 - w0) / messages:.3f} {(r1 - r0) / messages:.3f} {amplification:.2f}")
EOF
}

declare -A RATES CPUS WRITES READS AMPS
for round in $(seq "$ROUNDS"); do
    for build in old new; do
        binary=$OLD
        [ "$build" = new ] && binary=$NEW
        # In this shell, not a subshell, so that the trap ends its processes.
        run_once "$binary" "$@"
        read -r rate cpu writes reads amp < "$WORK/result"
        echo "round $round $build: $rate msg/s, broker CPU $cpu µs/msg, device $writes writes and $reads reads/msg, $amp bytes written/byte produced"
        RATES[$build]+="$rate "
        CPUS[$build]+="$cpu "
        WRITES[$build]+="$writes "
        READS[$build]+="$reads "
        AMPS[$build]+="$amp "
    done
done
for build in old new; do
    python3 - "$build" "${RATES[$build]}" "${CPUS[$build]}" "${WRITES[$build]}" \
        "${READS[$build]}" "${AMPS[$build]}" <<'EOF'
import statistics, sys
build = sys.argv[1]
rate, cpu, writes, reads, amp = (statistics.median(float(v) for v in a.split()) for a in sys.argv[2:7])
runs = len(sys.argv[2].split())
print(f"{build}: median {rate:,.0f} msg/s, broker CPU {cpu:.2f} µs/msg, "
      f"device {writes:.3f} writes and {reads:.3f} reads/msg, "
      f"{amp:.2f} bytes written/byte produced over {runs} runs")
EOF
done
