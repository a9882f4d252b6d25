#!/usr/bin/env python3
"""Checks that a `narad bench --report` page renders, offline, with its plots.

Starts a broker on a free loopback port, runs a short full flow with
`--report`, then opens the page in headless Chromium with every network
request refused (a proxy that does not exist and no name resolution) and
takes a screenshot. It fails (exit status 1, saying why) when:

- the page refers to anything outside itself (a script, style sheet, image,
  font or frame with a source, an `@import` or a `url(...)`);
- the rendered page has fewer than four charts, or a chart without a drawn
  line;
- the screenshot is blank: each chart's colours must show up in its pixels.

The screenshot is kept (`--out`, default a temporary directory) for a person
to look at. Standard library only; Chromium is Debian's `chromium` package
(`tools/install-deps.sh` installs it).

    python3 benches/report_check.py --binary target/release/narad
"""

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matrix import Broker  # noqa: E402

# The line colours of the report's charts (tools/src/bench/html.rs).
LINE_COLOURS = {"p50": (0x1F, 0x77, 0xB4), "p99": (0xFF, 0x7F, 0x0E)}
# Pixels of a line colour the screenshot must hold, each.
COLOUR_PIXELS_MIN = 200
EXTERNAL = re.compile(
    r"""<(script|link|img|iframe|embed|object|source|audio|video)\b[^>]*\b(src|href)\s*="""
    r"""|@import|url\(""",
    re.IGNORECASE,
)


def fail(why):
    print(f"report check FAILED: {why}", file=sys.stderr)
    sys.exit(1)


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    fail("no chromium on PATH (tools/install-deps.sh installs Debian's chromium)")


def offline_flags(profile):
    return [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        f"--user-data-dir={profile}", "--no-first-run", "--disable-extensions",
        "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-default-apps",
        # Every request the page might make goes nowhere.
        "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
    ]


def read_png_rgb(path):
    """Decodes an 8-bit, non-interlaced RGB or RGBA PNG into rows of RGB triples."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path} is not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        fail(f"unexpected PNG format (depth {depth}, colour type {colour})")
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, channels, rows


def colour_counts(path):
    width, _, channels, rows = read_png_rgb(path)
    wanted = {rgb: 0 for rgb in LINE_COLOURS.values()}
    for row in rows:
        for x in range(width):
            rgb = tuple(row[x * channels:x * channels + 3])
            if rgb in wanted:
                wanted[rgb] += 1
    return {name: wanted[rgb] for name, rgb in LINE_COLOURS.items()}


def run_bench(binary, duration, report):
    broker = Broker(binary, 1, None, {})
    try:
        run = subprocess.run(
            [binary, "bench", "-s", f"http://{broker.addr}", "--duration", duration,
             "--report", report],
            capture_output=True, text=True, timeout=120)
    finally:
        broker.stop()
    if run.returncode != 0:
        fail(f"narad bench failed:\n{run.stderr}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default="target/release/narad")
    parser.add_argument("--out", help="directory for the report and the screenshot")
    parser.add_argument("--duration", default="3", help="seconds of the run")
    parser.add_argument("--page", help="check this report instead of running narad bench")
    args = parser.parse_args()
    browser = chromium()
    out = args.out or tempfile.mkdtemp(prefix="narad-report-check-")
    os.makedirs(out, exist_ok=True)
    report = args.page or os.path.join(out, "report.html")
    screenshot = os.path.join(out, "report.png")
    if not args.page:
        run_bench(args.binary, args.duration, report)

    with open(report) as f:
        page = f.read()
    found = EXTERNAL.search(page)
    if found:
        fail(f"the page refers to something outside itself: {found.group(0)!r}")

    profile = tempfile.mkdtemp(prefix="narad-chromium-")
    try:
        url = "file://" + os.path.abspath(report)
        dom = subprocess.run([browser, *offline_flags(profile), "--dump-dom", url],
                             capture_output=True, text=True, timeout=120)
        if dom.returncode != 0 or "<svg" not in dom.stdout:
            fail(f"chromium did not render the page:\n{dom.stderr[-2000:]}")
        shot = subprocess.run([browser, *offline_flags(profile), "--window-size=1280,3200",
                               f"--screenshot={screenshot}", url],
                              capture_output=True, text=True, timeout=120)
        if shot.returncode != 0 or not os.path.exists(screenshot):
            fail(f"chromium took no screenshot:\n{shot.stderr[-2000:]}")
    finally:
        shutil.rmtree(profile, ignore_errors=True)

    charts = len(re.findall(r"<svg\b", dom.stdout))
    lines = len(re.findall(r"<polyline\b|<path\b", dom.stdout))
    if charts < 4:
        fail(f"the rendered page has {charts} charts, expected at least 4")
    if lines < charts:
        fail(f"the rendered page has {lines} drawn lines for {charts} charts")
    counts = colour_counts(screenshot)
    for name, count in counts.items():
        if count < COLOUR_PIXELS_MIN:
            fail(f"the screenshot shows {count} pixels of the {name} line colour "
                 f"(at least {COLOUR_PIXELS_MIN} expected): the plots did not draw")
    print(f"report check passed: {charts} charts, {lines} lines; line pixels {counts}")
    print(f"report: {report}")
    print(f"screenshot: {screenshot}")


if __name__ == "__main__":
    main()
