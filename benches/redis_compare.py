#!/usr/bin/env python3
"""Single-message produce beside Redis Streams with `appendfsync always`.

The yardstick the produce target names: Redis on one core, appending every
`XADD` to its AOF and fsyncing before it answers, driven by `redis-benchmark`
with 64 connections and 1 KiB values. Both servers run pinned to CPU 0 with
their data on the same disk, both load generators pinned to CPU 1, one after
the other, `--runs` times (alternating, so a disk that slows down hurts both),
and the medians are compared. Broker CPU per message comes from
`/proc/<pid>/stat`; Redis's likewise. So do the requests the disk under each
server's data completed a message (reads, writes and flushes, from
`/proc/diskstats` over the whole run: the device's, whatever else uses it):
on a virtual disk each costs the server a doorbell and an interrupt.

    python3 benches/redis_compare.py --binary target/release/narad --runs 3

Needs `redis-server` and `redis-benchmark` (`tools/install-deps.sh`). Both
servers listen on loopback only, on ports picked free, and are stopped after.
"""

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matrix import CLK_TCK, REPO, Broker, cpu_ticks  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def device_requests(path):
    """Reads, writes and flushes completed so far by the block device holding
    `path` (`/proc/diskstats`), or None when it is not listed there."""
    dev = os.stat(path).st_dev
    with open("/proc/diskstats") as stats:
        for line in stats:
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == (os.major(dev), os.minor(dev)):
                flushes = int(fields[18]) if len(fields) > 18 else 0
                return int(fields[3]) + int(fields[7]) + flushes
    return None


def per_message(before, after, messages):
    if before is None or after is None or not messages:
        return float("nan")
    return (after - before) / messages


def redis_run(args):
    data = tempfile.mkdtemp(prefix="narad-redis-", dir=args.data_parent)
    port = free_port()
    server = subprocess.Popen(
        ["taskset", "-c", "0", "redis-server", "--port", str(port), "--bind", "127.0.0.1",
         "--dir", data, "--appendonly", "yes", "--appendfsync", "always", "--save", "",
         "--protected-mode", "yes", "--daemonize", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)
        before = cpu_ticks(server.pid)
        requests_before = device_requests(data)
        out = subprocess.run(
            ["taskset", "-c", "1", "redis-benchmark", "-h", "127.0.0.1", "-p", str(port),
             "-c", "64", "-d", str(args.size), "-n", str(args.requests), "-q",
             "XADD", "s", "*", "f", "__data__"],
            capture_output=True, text=True, timeout=600).stdout
        used_s = (cpu_ticks(server.pid) - before) / CLK_TCK
        requests = per_message(requests_before, device_requests(data), args.requests)
        found = re.findall(r"([\d.]+) requests per second", out)
        if not found:
            raise RuntimeError(f"redis-benchmark printed no rate:\n{out}")
        return float(found[-1]), used_s * 1e6 / args.requests, requests
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)


def narad_run(args):
    broker = Broker(args.binary, 1, "0", {})
    out_dir = tempfile.mkdtemp(prefix="narad-redis-cmp-")
    try:
        path = os.path.join(out_dir, "r.json")
        command = [args.binary, "bench", "-s", f"http://{broker.addr}", "--mode", "produce",
                   "--workers", "64", "--size", str(args.size), "--count", str(args.requests),
                   "--partitions", str(args.partitions), "--cpu", "1", "--json", path]
        before = broker.ticks()
        requests_before = device_requests(broker.dir)
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        used_s = (broker.ticks() - before) / CLK_TCK
        requests_after = device_requests(broker.dir)
        if done.returncode != 0:
            raise RuntimeError(f"narad bench failed:\n{done.stderr[-2000:]}")
        with open(path) as f:
            result = json.load(f)
        requests = per_message(requests_before, requests_after, result["ok"])
        return result["rate"], used_s * 1e6 / result["ok"], result["p99_us"] / 1000, requests
    finally:
        broker.stop()
        shutil.rmtree(out_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.path.join(REPO, "target", "release", "narad"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--data-parent", default=os.path.join(REPO, "target"),
                        help="where Redis keeps its AOF (the disk under test)")
    args = parser.parse_args()
    for tool in ("redis-server", "redis-benchmark", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed: run tools/install-deps.sh")
    os.makedirs(args.data_parent, exist_ok=True)
    redis, narad = [], []
    for i in range(args.runs):
        redis.append(redis_run(args))
        narad.append(narad_run(args))
        print(f"run {i + 1}: redis {redis[-1][0]:,.0f}/s ({redis[-1][1]:.1f} µs CPU and "
              f"{redis[-1][2]:.3f} device requests each), "
              f"narad {narad[-1][0]:,.0f}/s ({narad[-1][1]:.1f} µs CPU and "
              f"{narad[-1][3]:.3f} device requests each, p99 {narad[-1][2]:.1f} ms)",
              file=sys.stderr)
    r_rate = statistics.median(r[0] for r in redis)
    n_rate = statistics.median(n[0] for n in narad)
    print("| server | acknowledged msg/s (runs) | median | server CPU µs/msg (median) "
          "| device requests/msg (median) |")
    print("|---|---|---|---|---|")
    print(f"| Redis XADD, appendfsync always | {' / '.join(f'{r[0]:,.0f}' for r in redis)} "
          f"| {r_rate:,.0f} | {statistics.median(r[1] for r in redis):.1f} "
          f"| {statistics.median(r[2] for r in redis):.3f} |")
    print(f"| Narad single produce | {' / '.join(f'{n[0]:,.0f}' for n in narad)} "
          f"| {n_rate:,.0f} | {statistics.median(n[1] for n in narad):.1f} "
          f"| {statistics.median(n[3] for n in narad):.3f} |")
    print(f"\nNarad / Redis: {n_rate / r_rate:.2f}")


if __name__ == "__main__":
    main()
