"""How much payload the disk can carry in the shape a durable produce gives it.

Every payload byte a broker of this design accepts is written to the disk
about `--amplification` times (the ingress WAL, then the partition log) and read
back once (the owner reads each commit back and checks it before it is
visible). fio's write bandwidth alone (`bandwidth-1m` in `baseline.fio`) says
nothing about that shape: on some disks reads cut deep into the writes beside
them.

This runs fio on one pre-written file: first its write bandwidth alone (1 MiB
writes, 4 in flight, as `bandwidth-1m`), then two jobs at once, a writer capped
at amplification x P bytes a second and a reader capped at P (1 MiB reads, 2 in
flight), and searches for the largest payload rate P that both hold (each at
95% of its cap or more). Neither job syncs, so the ceiling found is an upper
bound for any broker that writes and reads back that much: syncs only lower it.

    python3 benches/fio/readback.py [--amplification 2.1] [--seconds 6] [--steps 6]

FIO_DIR chooses the test file's directory (default ./target/fio), as for
`run.sh`. Prints each step, then the write bandwidth, the ceiling, and issue
3's batch produce target (70% of the write bandwidth over the amplification)
beside it. Figures are MB (10^6 bytes) a second.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

FILE_BYTES = 1 << 30
HOLDS = 0.95


def fio(directory, seconds, jobs):
    """Runs `jobs` (name -> options) at once on the test file; returns each
    job's (write, read) bytes a second."""
    args = [
        "fio",
        "--output-format=json",
        f"--directory={directory}",
        "--filename=baseline.dat",
        f"--size={FILE_BYTES}",
        "--overwrite=1",
        "--ioengine=io_uring",
        "--direct=1",
        "--bs=1m",
        "--time_based=1",
        f"--runtime={seconds}",
    ]
    for name, options in jobs.items():
        args.append(f"--name={name}")
        args.extend(f"--{key}={value}" for key, value in options.items())
    report = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return {
        job["jobname"]: (job["write"]["bw_bytes"], job["read"]["bw_bytes"])
        for job in report["jobs"]
    }


def mix(directory, seconds, amplification, payload):
    """Writes at amplification x payload and reads at payload at once; returns
    the rates reached and whether both held."""
    want_write = int(amplification * payload)
    rates = fio(
        directory,
        seconds,
        {
            "writer": {"rw": "write", "iodepth": 4, "rate": want_write},
            "reader": {"rw": "read", "iodepth": 2, "rate": int(payload)},
        },
    )
    wrote = rates["writer"][0]
    read = rates["reader"][1]
    held = wrote >= HOLDS * want_write and read >= HOLDS * payload
    return wrote, read, held


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--amplification", type=float, default=2.1)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=6)
    options = parser.parse_args()
    if shutil.which("fio") is None:
        sys.exit("fio is not installed: run tools/install-deps.sh")
    directory = os.environ.get("FIO_DIR", "target/fio")
    os.makedirs(directory, exist_ok=True)

    write_alone = fio(directory, options.seconds, {"bandwidth-1m": {"rw": "write", "iodepth": 4}})
    write_bw = write_alone["bandwidth-1m"][0]
    print(f"writes alone: {write_bw / 1e6:,.0f} MB/s")

    low, high = 0.0, write_bw / options.amplification
    for step in range(options.steps):
        payload = (low + high) / 2
        wrote, read, held = mix(directory, options.seconds, options.amplification, payload)
        print(
            f"step {step + 1}: payload {payload / 1e6:,.0f} MB/s: "
            f"wrote {wrote / 1e6:,.0f} of {options.amplification * payload / 1e6:,.0f}, "
            f"read {read / 1e6:,.0f} of {payload / 1e6:,.0f}: {'held' if held else 'fell short'}"
        )
        if held:
            low = payload
        else:
            high = payload
    target = 0.7 * write_bw / options.amplification
    print(f"ceiling: {low / 1e6:,.0f} MB/s of payload (held; {high / 1e6:,.0f} did not)")
    print(
        f"70% of writes alone over {options.amplification}: {target / 1e6:,.0f} MB/s, "
        f"{target / low if low else float('inf'):.2f} x the ceiling"
    )


if __name__ == "__main__":
    sys.exit(main())
