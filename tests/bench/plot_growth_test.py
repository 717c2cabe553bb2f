#!/usr/bin/python3
"""Checks tests/bench/plot_growth.py on small generated results JSON files.

Usage: plot_growth_test.py PLOT_GROWTH_PY

A full growth list must give the three PNG files, each a valid PNG (signature, IHDR chunk and its
CRC, an IEND chunk) of a plausible size; a list with one series only gives that series' plot; a
results JSON without growth entries, a malformed entry and a missing file each exit 2 with a
message naming the problem.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

GIB = 1024**3


def growth_entries():
    out = []
    for factor in (1, 2, 4):
        size = factor * 16 * 2**20
        for op, per_gib in (("upload", 2.0), ("fetch", 0.7), ("transform", 1.1)):
            out.append({"case": f"{op}_bytes", "series": "bytes", "op": op, "size": size,
                        "seconds": per_gib * size / GIB + 0.01, "peak_rss_mib": 120.0 + factor,
                        "bytes": size, "tensors": 64})
    for count in (100, 1000, 20000):
        for op in ("upload", "fetch"):
            out.append({"case": f"{op}_tensors", "series": "tensors", "op": op, "size": count,
                        "seconds": 0.05 + count * 2e-5, "peak_rss_mib": 110.0 + count / 1000,
                        "bytes": 32 * 2**20, "tensors": count})
    for ranks in (8, 64, 512, 4096):
        out.append({"case": "deps_ranks", "series": "ranks", "op": "deps", "size": ranks,
                    "seconds": 1e-4 + ranks * 5e-6, "peak_rss_mib": None, "bytes": None,
                    "tensors": None})
    return out


def check_png(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: no PNG signature"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13, f"{path}: first chunk is {kind!r}, not IHDR"
    ihdr = data[16:29]
    (crc,) = struct.unpack(">I", data[29:33])
    assert zlib.crc32(b"IHDR" + ihdr) == crc, f"{path}: IHDR CRC mismatch"
    width, height = struct.unpack(">II", ihdr[:8])
    assert 300 <= width <= 4000 and 200 <= height <= 4000, f"{path}: {width}x{height}"
    assert data[-12:-4] == b"\x00\x00\x00\x00IEND", f"{path}: does not end with IEND"
    assert len(data) > 5000, f"{path}: only {len(data)} bytes, nothing drawn?"


def run(script, results, out_dir):
    return subprocess.run([sys.executable, script, results, out_dir], capture_output=True,
                          text=True, timeout=120, check=False)


def write(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f)


def main():
    script = sys.argv[1]
    names = ["growth-bytes.png", "growth-tensors.png", "growth-ranks.png"]
    with tempfile.TemporaryDirectory() as tmp:
        full = os.path.join(tmp, "full.json")
        write(full, {"growth": growth_entries(), "targets": []})
        out = os.path.join(tmp, "img")
        r = run(script, full, out)
        assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}"
        for name in names:
            check_png(os.path.join(out, name))

        ranks_only = os.path.join(tmp, "ranks.json")
        write(ranks_only, {"growth": [e for e in growth_entries() if e["series"] == "ranks"]})
        out2 = os.path.join(tmp, "img2")
        r = run(script, ranks_only, out2)
        assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}"
        assert sorted(os.listdir(out2)) == ["growth-ranks.png"], os.listdir(out2)
        check_png(os.path.join(out2, "growth-ranks.png"))

        bad_inputs = {
            "empty.json": ({"growth": []}, "no growth results"),
            "malformed.json": ({"growth": [{"series": "bytes", "op": "upload"}]},
                               "growth[0] is malformed"),
            "negative.json": ({"growth": [{"series": "bytes", "op": "upload", "size": 0,
                                           "seconds": 1}]}, "growth[0] has size 0"),
        }
        for name, (obj, message) in bad_inputs.items():
            path = os.path.join(tmp, name)
            write(path, obj)
            r = run(script, path, os.path.join(tmp, "bad"))
            assert r.returncode == 2 and message in r.stderr, (name, r.returncode, r.stderr)
        r = run(script, os.path.join(tmp, "absent.json"), os.path.join(tmp, "bad"))
        assert r.returncode == 2 and "cannot read" in r.stderr, (r.returncode, r.stderr)
        assert not os.path.exists(os.path.join(tmp, "bad")) or not os.listdir(
            os.path.join(tmp, "bad")), "bad input wrote plots"
    print("plot_growth_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
