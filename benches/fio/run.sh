#!/usr/bin/env bash
# Runs the fio baseline (benches/fio/baseline.fio) and prints a summary table.
#
# Environment:
#   FIO_DIR        directory for the 1 GiB test file (default: ./target/fio). Put it
#                  on the disk whose figures you want: they say nothing about others.
#   FIO_RUNTIME_S  seconds per job (default: 20; four jobs run one after another).
#   FIO_JSON       where to keep fio's full JSON report (default: $FIO_DIR/baseline.json).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo_root"

if ! command -v fio >/dev/null 2>&1; then
    tools/install-deps.sh
fi
if ! command -v fio >/dev/null 2>&1; then
    echo "fio is not installed and could not be installed (see tools/install-deps.sh)" >&2
    exit 1
fi

export FIO_DIR=${FIO_DIR:-$repo_root/target/fio}
export FIO_RUNTIME_S=${FIO_RUNTIME_S:-20}
json_report=${FIO_JSON:-$FIO_DIR/baseline.json}
mkdir -p "$FIO_DIR" "$(dirname "$json_report")"

echo "fio baseline: $FIO_RUNTIME_S s per job, file in $FIO_DIR"
fio --output-format=json --output="$json_report" benches/fio/baseline.fio
python3 benches/fio/summarize.py "$json_report"
echo "full report: $json_report"
