#!/usr/bin/env bash
# Installs the Debian packages that Narad's benchmarks need, when they are missing.
#
# Safe to run any number of times: it asks apt for nothing when every command is
# already present, and refreshes the package index only when an install is due.
#
# The test suite needs no system package, and this script keeps it that way: every
# package below is needed by benchmarks only, so when apt is missing, or the
# install fails (no network, not root), it warns and exits 0 rather than failing a
# CI run that never benchmarks. The benchmark scripts check for their tools
# themselves and stop with a clear message.
#
# Locked memory (RLIMIT_MEMLOCK) is deliberately not touched here: the process
# raises its own soft limit to the hard limit at startup, and a hard limit can only
# be raised by whoever starts the process (systemd's LimitMEMLOCK, a container's
# ulimit settings), not by a script that has already exited.
set -euo pipefail

# Command name and the Debian package that provides it, for benchmark-only tools.
bench_tools=(
    "fio:fio"
    "wrk:wrk"
    "redis-server:redis-server"
    "redis-benchmark:redis-tools"
    "chromium:chromium"
)

missing_packages=()
for entry in "${bench_tools[@]}"; do
    command_name=${entry%%:*}
    package=${entry#*:}
    if ! command -v "$command_name" >/dev/null 2>&1; then
        missing_packages+=("$package")
    fi
done

if [ ${#missing_packages[@]} -eq 0 ]; then
    echo "install-deps: nothing to install"
    exit 0
fi

warn_and_continue() {
    echo "install-deps: warning: $1; benchmarks need: ${missing_packages[*]}" >&2
    exit 0
}

if ! command -v apt-get >/dev/null 2>&1; then
    warn_and_continue "apt-get is not available"
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
    else
        warn_and_continue "not root and no password-less sudo"
    fi
fi

echo "install-deps: installing ${missing_packages[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq || warn_and_continue "apt-get update failed"
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing_packages[@]}" ||
    warn_and_continue "apt-get install failed"
