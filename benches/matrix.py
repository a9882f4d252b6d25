#!/usr/bin/env python3
"""The `narad bench` matrix: the broker measured through its HTTP API.

Four workloads (single produce, batch produce, full flow, full flow with
batches) on two layouts of a two-core machine:

- `1 shard, pinned`: the broker runs one shard on CPU 0 and the generator is
  pinned to CPU 1, so neither competes with the other;
- `2 shards, shared`: the broker runs two shards (one per core) and the
  generator shares the machine with them, unpinned.

Each cell runs `--runs` times (default 3) against a fresh broker and a fresh
topic, and the table gives the median of each figure. Broker CPU comes from
`/proc/<pid>/stat` (user + system time of every thread) over the run, divided
by the messages the run counted (acknowledged produces, or consumed and acked
messages in flow modes), so it carries everything the broker did for them.

The result is a Markdown section written between the markers
`<!-- matrix:begin -->` and `<!-- matrix:end -->` of `benches/RESULTS.md`
(appended when absent), or printed with `--print`. Only the standard library is
used; the broker binary is built beforehand (`cargo build --release`).
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benches", "RESULTS.md")
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The broker's per-client consume cap counts a `max=100` request as 100: the
# batch flow's 64 consumers of one loopback client need more than the default.
BATCH_FLOW_CONSUME_CAP = "100000"

# (name, what it runs, bench flags, broker environment)
WORKLOADS = [
    ("produce", "single produce, 64 connections",
     ["--mode", "produce", "--workers", "64"], {}),
    ("batch produce", "100 records per request, 8 connections",
     ["--mode", "produce", "--workers", "8", "--batch", "100"], {}),
    ("flow", "produce + consume + ack, 64 + 64 connections",
     ["--mode", "flow", "--producers", "64", "--consumers", "64"], {}),
    ("flow, batches", "batch produce 100, consume max=100 + batch ack, 64 + 64",
     ["--mode", "flow", "--producers", "64", "--consumers", "64",
      "--batch", "100", "--max", "100"],
     {"NARAD_HTTP_MAX_CONSUME_IN_FLIGHT_PER_IDENTITY": BATCH_FLOW_CONSUME_CAP}),
]

# (name, broker shards, broker CPU list or None, generator CPU or None)
LAYOUTS = [
    ("1 shard, pinned", 1, "0", 1),
    ("2 shards, shared", 2, None, None),
]


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15; fields[0] here is field 3.
    return int(fields[11]) + int(fields[12])


class Broker:
    """A broker on a free loopback port with its own data directory."""

    def __init__(self, binary, shards, cpus, env):
        self.dir = tempfile.mkdtemp(prefix="narad-matrix-")
        self.log_path = os.path.join(self.dir, "broker.log")
        command = [binary, "serve", "--dev", "--port", "0", "--shards", str(shards),
                   "--data-dir", os.path.join(self.dir, "data"), "--log-format", "text"]
        if cpus is not None:
            command = ["taskset", "-c", cpus] + command
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **env})
        self.addr = self._wait_until_ready()

    def _wait_until_ready(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited: see {self.log_path}")
            with open(self.log_path) as f:
                found = re.search(r"addr=(\S+)", f.read())
            if found and self._ready(found.group(1)):
                return found.group(1)
            time.sleep(0.1)
        raise RuntimeError(f"broker did not become ready: see {self.log_path}")

    @staticmethod
    def _ready(addr):
        try:
            with urllib.request.urlopen(f"http://{addr}/readyz", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def ticks(self):
        return cpu_ticks(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def bench_command(binary, addr, flags, gen_cpu, args, json_path):
    command = [binary, "bench", "-s", f"http://{addr}", "--size", str(args.size),
               "--duration", str(args.duration), "--partitions", str(args.partitions),
               "--json", json_path] + flags
    if gen_cpu is not None:
        command += ["--cpu", str(gen_cpu)]
    return command


def run_once(binary, layout, workload, args):
    _, shards, broker_cpus, gen_cpu = layout
    _, _, flags, env = workload
    broker = Broker(binary, shards, broker_cpus, env)
    try:
        json_path = os.path.join(broker.dir, "result.json")
        command = bench_command(binary, broker.addr, flags, gen_cpu, args, json_path)
        before = broker.ticks()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, timeout=args.duration * 4 + 120)
        used_s = (broker.ticks() - before) / CLK_TCK
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        with open(json_path) as f:
            result = json.load(f)
    finally:
        broker.stop()
    flow = "consumed" in result
    messages = result["consumed"] if flow else result["ok"]
    e2e = result.get("e2e_latency") or {}
    return {
        "produced_rate": result.get("rate", 0.0),
        "consumed_rate": result.get("consumed_rate") if flow else None,
        "p50_ms": result.get("p50_us", 0) / 1000,
        "p99_ms": result.get("p99_us", 0) / 1000,
        "e2e_p99_ms": e2e.get("p99_us", 0) / 1000 if flow else None,
        "cpu_us": used_s * 1e6 / messages if messages else float("nan"),
        "errors": result.get("failed", 0) + result.get("server_errors", 0),
        "missing": result.get("missing") or 0,
    }


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, digits=0):
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def machine_lines():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = re.search(r"model name\s*:\s*(.+)", f.read()).group(1)
    except (OSError, AttributeError):
        pass
    return [f"- `nproc`: {os.cpu_count()} ({cpu}), kernel {platform.release()}"]


def fio_lines():
    path = os.path.join(REPO, "target", "fio", "baseline.json")
    if not os.path.exists(path) or time.time() - os.path.getmtime(path) > 6 * 3600:
        return ["- fio baseline: not run in this session (`make fio`)"]
    with open(path) as f:
        report = json.load(f)
    parts = []
    for job in report.get("jobs", []):
        write = job.get("write", {})
        parts.append(f"{job['jobname']} {write.get('iops', 0):,.0f}/s "
                     f"{write.get('bw_bytes', 0) / 1e6:,.0f} MB/s")
    return ["- fio baseline of this session (`benches/fio/run.sh`): " + "; ".join(parts)]


def commit():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def section(rows, args):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        "## The `narad bench` matrix (`make bench`)",
        "",
        f"Generated by `benches/matrix.py` on {now}, release build of `{commit()}`, "
        f"{args.duration} s runs, {args.size} B payloads, {args.partitions} partitions, "
        f"median of {args.runs} runs per cell (a fresh broker and topic each run). "
        "Broker CPU is per counted message: acknowledged produces, or consumed and "
        "acked messages in flow modes.",
        "",
        *machine_lines(),
        *fio_lines(),
        "",
        "| layout | workload | produced msg/s | consumed msg/s | produce p50 / p99 ms "
        "| e2e p99 ms | broker CPU µs/msg | errors | missing |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for layout, workload, runs in rows:
        m = {key: median([r[key] for r in runs]) for key in runs[0]}
        lines.append(
            f"| {layout} | {workload} | {fmt(m['produced_rate'])} | {fmt(m['consumed_rate'])} "
            f"| {fmt(m['p50_ms'], 1)} / {fmt(m['p99_ms'], 1)} | {fmt(m['e2e_p99_ms'], 1)} "
            f"| {fmt(m['cpu_us'], 1)} | {sum(r['errors'] for r in runs)} "
            f"| {sum(r['missing'] for r in runs)} |")
    lines += [
        "",
        "Workloads: " + "; ".join(f"**{name}**: {what} (`{' '.join(flags)}`)"
                                  for name, what, flags, _ in WORKLOADS) + ".",
        "Layouts: **1 shard, pinned**: `taskset -c 0 narad serve --shards 1`, generator "
        "`--cpu 1`; **2 shards, shared**: `narad serve --shards 2`, generator unpinned.",
        END,
    ]
    return "\n".join(lines) + "\n"


def write_results(text):
    with open(RESULTS) as f:
        current = f.read()
    if BEGIN in current and END in current:
        head, rest = current.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        updated = head + text + ("\n" + tail if tail else "")
    else:
        updated = current.rstrip("\n") + "\n\n" + text
    with open(RESULTS, "w") as f:
        f.write(updated)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.path.join(REPO, "target", "release", "narad"))
    parser.add_argument("--duration", type=int, default=5, help="seconds per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--only", help="run only workloads whose name contains this")
    parser.add_argument("--print", action="store_true",
                        help="print the section instead of updating RESULTS.md")
    args = parser.parse_args()
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"{args.binary} is missing: build it with `cargo build --release`")
    if os.cpu_count() < 2:
        sys.exit("the matrix needs two CPUs (one for the broker, one for the generator)")
    rows = []
    for layout in LAYOUTS:
        for workload in WORKLOADS:
            if args.only and args.only not in workload[0]:
                continue
            runs = []
            for i in range(args.runs):
                result = run_once(args.binary, layout, workload, args)
                print(f"{layout[0]} / {workload[0]} run {i + 1}: "
                      + ", ".join(f"{k}={fmt(v, 1)}" for k, v in result.items()),
                      file=sys.stderr)
                runs.append(result)
            rows.append((layout[0], workload[0], runs))
    text = section(rows, args)
    if args.print:
        print(text)
    else:
        write_results(text)
        print(f"updated {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
