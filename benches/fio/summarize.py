"""Prints a table from the JSON that `fio --output-format=json` wrote.

One row per job: block size, queue depth, writes and fdatasyncs per second, write
bandwidth in MB/s (10^6 bytes), and the median and 99th percentile latency of the
fdatasync calls alone. fio reports sync latencies under `sync.lat_ns`; its
`sync.total_ios` stays zero with the io_uring engine, so the sync count is taken
from the latency histogram's sample count instead.
"""

import json
import sys


def micros(nanos):
    return f"{nanos / 1000:.0f}"


def row(job):
    options = job["job options"]
    seconds = job["job_runtime"] / 1000
    write = job["write"]
    sync_lat = job["sync"]["lat_ns"]
    percentiles = sync_lat.get("percentile", {})
    synced = sync_lat.get("N", 0) > 0 and percentiles
    return [
        job["jobname"],
        options.get("bs", "?"),
        options.get("iodepth", "1"),
        f"{write['total_ios'] / seconds:.0f}",
        f"{sync_lat['N'] / seconds:.0f}" if synced else "-",
        f"{write['bw_bytes'] / 1e6:.1f}",
        micros(percentiles["50.000000"]) if synced else "-",
        micros(percentiles["99.000000"]) if synced else "-",
    ]


def main(path):
    with open(path) as source:
        report = json.load(source)
    header = [
        "job",
        "bs",
        "qd",
        "writes/s",
        "fdatasyncs/s",
        "MB/s",
        "sync p50 us",
        "sync p99 us",
    ]
    rows = [row(job) for job in report["jobs"]]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def line(cells):
        # The job name reads best flush left; numbers line up flush right.
        padded = [cells[0].ljust(widths[0])]
        padded += [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "| " + " | ".join(padded) + " |"

    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: summarize.py FIO_JSON")
    main(sys.argv[1])
