#!/usr/bin/env bash
# Shows that the durability tests can fail: each deliberately broken variant
# (a test-only cargo feature that breaks one guarantee) must make its test fail.
# A variant whose test still passes means the test proves nothing, and this
# script fails. Their output goes to target/prove-tests-fail/; cargo keeps each
# feature set's artifacts apart, so the normal build stays valid.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target_dir="${CARGO_TARGET_DIR:-target}"
log_dir="target/prove-tests-fail"
mkdir -p "$log_dir"

# feature | package | test target | what breaks
variants=(
  "broken-ack-before-fsync|narad-shards|wal_crash|the WAL acknowledges before fdatasync"
  "broken-checkpoint-past-uncommitted|narad-shards|wal_crash|the checkpoint passes records still being committed"
  "broken-checkpoint-past-uncommitted|narad|crash_sigkill|the same, in a real process killed with SIGKILL"
  "broken-checkpoint-past-uncommitted|narad-shards|dispatch_sim|the same, in the dispatcher's seeded simulation"
  "broken-checkpoint-past-uncommitted|narad-shards|produce_sim|the same, through the real dispatch task, combiner and logs"
  "broken-dispatched-skipped-as-done|narad-shards|dispatch_sim|a graceful stop leaves the records it skipped (left in the WAL) as done"
  "broken-dispatched-skipped-as-done|narad-shards|produce_sim|the same, through the real WAL, dispatch task and logs"
  "broken-no-torn-truncation|narad-shards|wal_crash|recovery resumes after a torn write instead of at its hole"
  "broken-no-readback|narad-shards|log_faults|a partition commit skips the read-back and CRC check"
  "broken-log-trust-stale-hint|narad-shards|log_crash|a partition log open trusts a tail hint that commits after it made stale"
  "broken-log-trust-stale-hint|narad-shards|log_open|the same, in the hint's own tests"
  "broken-log-unmasked|narad-shards|log_recovery|partition log frames carry payloads unmasked, so recovery takes a frame forged inside one for the log's"
  "broken-ack-state-no-anchor|narad-shards|consumer_state|the consumer-state committer writes its window into the durable anchor slot"
  "broken-growing-dsync|narad-shards|log_crash|a partition commit that grows its segment file is one O_DSYNC write, whose new size the file system may lose"
  "broken-growing-dsync|narad-shards|wal_crash|the same for a WAL batch that grows its segment file"
)
# A kill lands at a random moment, so a real-process test may need more than one
# run to catch its variant (three runs in a row once missed it on a loaded
# machine); seeded tests are given this many runs too (they stop at their first
# failing seed, so a caught variant costs one run).
attempts_max=5

caught=0
missed=0
for variant in "${variants[@]}"; do
  IFS='|' read -r feature package test what <<<"$variant"
  log="$log_dir/$feature-$test.log"
  verdict="passed"
  for attempt in $(seq 1 "$attempts_max"); do
    # Enough seeds that a broken variant is caught; a run stops at its first failure.
    # --workspace resolves the dependencies' features as the suite's own build
    # did, so only the broken package and its dependents are built again.
    if NARAD_CRASH_SEEDS=400 CARGO_TARGET_DIR="$target_dir" \
        cargo test --workspace --features "$package/$feature" --test "$test" >"$log" 2>&1; then
      continue
    elif grep -q "panicked" "$log"; then
      verdict="caught"
    else
      verdict="did not run (build error?)"
    fi
    break
  done
  if [ "$verdict" = "caught" ]; then
    echo "caught: $feature ($what) fails test '$test' (run $attempt)"
    caught=$((caught + 1))
  else
    echo "NOT CAUGHT: $feature ($what): test '$test' $verdict; see $log"
    missed=$((missed + 1))
  fi
done
echo "prove-tests-fail: $caught passed, $missed failed"
[ "$missed" -eq 0 ]
