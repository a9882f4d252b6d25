#!/usr/bin/env python3
"""Consume cost against the depth of the backlog.

For each backlog size (default 1 million and 10 million records), starts a
fresh broker (one shard pinned to CPU 0), fills a fresh topic with that many
records by batch produce, waits until every record is committed, then drains a
fixed number of them (`--consume`, default 200,000) with `narad bench --mode
consume` pinned to CPU 1, and divides the broker's CPU time over the drain
(`/proc/<pid>/stat`, user + system) by the messages consumed and acked. A
consume path whose cost does not grow with the backlog gives the same figure
for both sizes; the records consumed sit far behind the partition log's
recent-frame cache, so every read comes from disk.

Prints one line per size and the ratio of the two; `--runs` repeats the drain
on the same backlog. Standard library only; needs a release build.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matrix import CLK_TCK, REPO, Broker  # noqa: E402

TOPIC = "backlog"


def http_json(addr, method, path, body=None):
    request = urllib.request.Request(
        f"http://{addr}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read()
    return json.loads(text) if text else None


def committed(addr):
    topic = http_json(addr, "GET", f"/v1/topics/{TOPIC}")
    return sum(p.get("high_watermark", 0) for p in topic["partition_stats"])


def bench(binary, addr, flags, timeout):
    out_dir = tempfile.mkdtemp(prefix="narad-backlog-")
    path = os.path.join(out_dir, "r.json")
    try:
        done = subprocess.run([binary, "bench", TOPIC, "-s", f"http://{addr}", "--cpu", "1",
                               "--json", path] + flags,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"narad bench {' '.join(flags)} failed:\n{done.stderr[-2000:]}")
        with open(path) as f:
            return json.load(f)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def measure(args, backlog):
    broker = Broker(args.binary, 1, "0", {})
    try:
        http_json(broker.addr, "POST", "/v1/topics", {"name": TOPIC, "partitions": args.partitions})
        started = time.monotonic()
        bench(args.binary, broker.addr, ["--mode", "produce", "--count", str(backlog),
                                         "--batch", "100", "--workers", "8",
                                         "--size", str(args.size)], timeout=3600)
        while committed(broker.addr) < backlog:
            time.sleep(1)
        print(f"backlog {backlog:,}: filled in {time.monotonic() - started:.0f} s",
              file=sys.stderr)
        figures = []
        for _ in range(args.runs):
            before = broker.ticks()
            result = bench(args.binary, broker.addr,
                           ["--mode", "consume", "--count", str(args.consume),
                            "--consumers", str(args.consumers)], timeout=3600)
            used_s = (broker.ticks() - before) / CLK_TCK
            consumed = result["consumed"]
            figures.append((used_s * 1e6 / consumed, result["consumed_rate"]))
            print(f"backlog {backlog:,}: {consumed:,} consumed at {result['consumed_rate']:,.0f}"
                  f"/s, {figures[-1][0]:.1f} µs of broker CPU each", file=sys.stderr)
        return (statistics.median(f[0] for f in figures),
                statistics.median(f[1] for f in figures))
    finally:
        broker.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.path.join(REPO, "target", "release", "narad"))
    parser.add_argument("--backlogs", default="1000000,10000000")
    parser.add_argument("--consume", type=int, default=200_000)
    parser.add_argument("--consumers", type=int, default=64)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = []
    for backlog in (int(b) for b in args.backlogs.split(",")):
        cpu, rate = measure(args, backlog)
        results.append((backlog, cpu, rate))
    print("| backlog | consumed per run | consumed msg/s | broker CPU µs/msg |")
    print("|---|---|---|---|")
    for backlog, cpu, rate in results:
        print(f"| {backlog:,} | {args.consume:,} | {rate:,.0f} | {cpu:.1f} |")
    if len(results) > 1:
        print(f"\nCPU per message, deepest / shallowest backlog: "
              f"{results[-1][1] / results[0][1]:.3f}")


if __name__ == "__main__":
    main()
