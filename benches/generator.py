#!/usr/bin/env python3
"""What the load generator costs: `narad bench` beside `wrk` on the same server.

Starts one broker (one shard pinned to CPU 0), then runs each generator pinned
to CPU 1 with the same number of connections against the same route, one
request in flight per connection, and reads each generator's CPU time from
`/proc/<pid>/stat` (user + system, every thread). The figure that matters is
generator CPU per request: the lower it is, the more load one core can offer
before the generator, not the broker, sets the pace.

Routes:
- `produce`: `POST /v1/topics/<t>/produce` with a 1 KiB body (the produce
  benchmark's request); `wrk` sends it from a small Lua script;
- `healthz`: `GET /healthz`, the broker's cheapest route, which shows the
  most requests a second each generator can drive.

The `healthz` route needs a `narad bench` that can target it (`--mode ping`);
without one it is skipped. `--floor` adds both generators against
`examples/floor_responder.rs` (one epoll thread answering a fixed `200 OK`,
pinned to CPU 0 as the broker is): the least a request costs a server over
this machine's loopback TCP, next to what the broker's cheapest route costs.
The server's CPU per request is read from `/proc/<pid>/stat` too. Prints a Markdown table; `--runs` repeats each
measurement and reports the median. Standard library only; `wrk` comes from
`tools/install-deps.sh`.
"""

import argparse
import os
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matrix import REPO, Broker, cpu_ticks  # noqa: E402

WRK_PRODUCE_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.body = '{"bench":"' .. string.rep("x", %d) .. '"}'
"""


def measured(command):
    """Runs `command`, returning (its stdout and stderr, CPU seconds it used)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    # wait4's resource usage covers every thread of the child; `taskset` execs
    # the generator, so the child is the generator itself.
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return out, usage.ru_utime + usage.ru_stime


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class FloorServer:
    """`examples/floor_responder.rs` on a free loopback port, pinned to CPU 0."""

    def __init__(self):
        subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "floor_responder"],
                       cwd=REPO, check=True)
        binary = os.path.join(REPO, "target", "release", "examples", "floor_responder")
        self.proc = subprocess.Popen(["taskset", "-c", "0", binary, "0"],
                                     stdout=subprocess.PIPE, text=True)
        try:
            self.addr = self.proc.stdout.readline().split()[1]
        except Exception:
            self.stop()
            raise

    def ticks(self):
        return cpu_ticks(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def wrk_run(addr, path, connections, seconds, lua=None):
    command = ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{seconds}s"]
    if lua:
        command += ["-s", lua]
    out, cpu_s = measured(command + [f"http://{addr}{path}"])
    found = re.search(r"Requests/sec:\s*([\d.]+)", out)
    if not found:
        raise RuntimeError(f"wrk printed no rate:\n{out}")
    rate = float(found.group(1))
    return rate, cpu_s / (rate * seconds) * 1e6, rate * seconds


def with_server_cpu(server, run):
    """Runs `run`, adding the server's CPU µs per request to its result."""
    before = server.ticks()
    rate, generator_us, requests = run()
    server_s = (server.ticks() - before) / CLOCK_TICKS
    return rate, generator_us, server_s / (requests or 1) * 1e6


def bench_run(binary, addr, args, flags):
    json_path = os.path.join(tempfile.mkdtemp(prefix="narad-gen-"), "r.json")
    command = [binary, "bench", "-s", f"http://{addr}", "--cpu", "1", "--workers",
               str(args.connections), "--duration", str(args.seconds), "--json", json_path] + flags
    out, cpu_s = measured(command)
    try:
        with open(json_path) as f:
            result = json.load(f)
    except OSError:
        raise RuntimeError(f"narad bench failed:\n{out}")
    finally:
        shutil.rmtree(os.path.dirname(json_path), ignore_errors=True)
    rate = result["rate"]
    return rate, cpu_s / (result["ok"] or 1) * 1e6, result["ok"]


def bench_supports_ping(binary):
    help_text = subprocess.run([binary, "bench", "--help"], capture_output=True, text=True).stdout
    return "ping" in help_text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.path.join(REPO, "target", "release", "narad"))
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--floor", action="store_true",
                        help="also measure both generators against examples/floor_responder.rs")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: run tools/install-deps.sh")
    broker = Broker(args.binary, 1, "0", {})
    floor = None
    lua_dir = tempfile.mkdtemp(prefix="narad-wrk-")
    try:
        topic = "generator"
        create = urllib.request.Request(
            f"http://{broker.addr}/v1/topics", method="POST",
            data=f'{{"name":"{topic}","partitions":6}}'.encode(),
            headers={"Content-Type": "application/json"})
        urllib.request.urlopen(create, timeout=10).close()
        lua = os.path.join(lua_dir, "produce.lua")
        with open(lua, "w") as f:
            f.write(WRK_PRODUCE_LUA % (args.size - 12))
        cases = [("produce", "wrk", broker,
                  lambda: wrk_run(broker.addr, f"/v1/topics/{topic}/produce",
                                  args.connections, args.seconds, lua)),
                 ("produce", "narad bench", broker,
                  lambda: bench_run(args.binary, broker.addr, args,
                                    [topic, "--size", str(args.size)])),
                 ("healthz", "wrk", broker,
                  lambda: wrk_run(broker.addr, "/healthz", args.connections, args.seconds))]
        ping = bench_supports_ping(args.binary)
        if ping:
            cases.append(("healthz", "narad bench", broker,
                          lambda: bench_run(args.binary, broker.addr, args, ["--mode", "ping"])))
        if args.floor:
            floor = FloorServer()
            cases.append(("floor responder", "wrk", floor,
                          lambda: wrk_run(floor.addr, "/healthz", args.connections, args.seconds)))
            if ping:
                cases.append(("floor responder", "narad bench", floor,
                              lambda: bench_run(args.binary, floor.addr, args, ["--mode", "ping"])))
        print(f"| route | generator | requests/s (median of {args.runs}) "
              "| generator CPU µs/request | server CPU µs/request |")
        print("|---|---|---|---|---|")
        for route, name, server, run in cases:
            results = [with_server_cpu(server, run) for _ in range(args.runs)]
            rate = statistics.median(r[0] for r in results)
            cpu = statistics.median(r[1] for r in results)
            server_cpu = statistics.median(r[2] for r in results)
            print(f"| {route} | {name} | {rate:,.0f} | {cpu:.2f} | {server_cpu:.2f} |", flush=True)
    finally:
        broker.stop()
        if floor is not None:
            floor.stop()
        shutil.rmtree(lua_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
