#!/usr/bin/python3
"""Fetch throughput and memory of the Python client (ckptd.Client.fetch), for the bench harness.

Fetches each of the given destination ranks of a stored checkpoint (or the merged checkpoint)
with the Python client, `--passes` times after one unmeasured warm-up pass, keeping one rank's
arrays at a time, and prints one JSON object on stdout:

  {"checkpoint", "dst_strategy", "ranks", "mode",
   "bytes":            tensor bytes fetched in one pass (all ranks),
   "max_rank_bytes":   the largest rank's tensor bytes,
   "passes_gibps":     GiB/s of each measured pass (bytes / wall seconds),
   "gibps":            their median,
   "warmup_gibps":     the unmeasured first pass,
   "cpu_seconds_per_gib": this process's CPU (user + system) per GiB over the measured passes,
   "baseline_rss_bytes":  resident set after importing and connecting, before any fetch,
   "peak_rss_bytes":      peak resident set of the process (getrusage ru_maxrss),
   "malloc_tuning":       whether ckptd.malloc_tuning.tune_malloc_for_streaming() was applied,
   "path":                the fetch path measured: "native" (ckptd._native) or "grpcio"}

The allocator policy of ckptd.malloc_tuning (freed arrays kept for the next fetch) is applied
first, as a program that fetches repeatedly would; `--no-malloc-tuning` leaves glibc's defaults.

`--mode fetch` (default) measures Client.fetch (one pre-allocated array per tensor);
`--mode iter` measures Client.iter_fetch, dropping each array as it completes; `--mode file`
measures Client.fetch_to_file into --out (default /dev/null).

`--stdin-passes` lets another program interleave its own passes with these (the bench harness
alternates them with the C++ library's): the script prints `ready` once connected, then runs one
pass per `go` line on stdin, printing `{"gibps", "bytes", "seconds", "path"}` for it, and on `quit` (or end
of input) prints the JSON object above, the first pass counting as the warm-up, and exits.

Usage: python_fetch_bench.py --server HOST:PORT --checkpoint ID
           (--dst-strategy NAME --ranks 0,1,2 | --merged) [--passes 3] [--mode fetch]
           [--pythonpath build/python] [--no-malloc-tuning] [--stdin-passes]
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time


def parse_ranks(text):
    ranks = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            ranks.extend(range(int(lo), int(hi) + 1))
        elif part:
            ranks.append(int(part))
    return ranks


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dst-strategy")
    parser.add_argument("--ranks", default="")
    parser.add_argument("--merged", action="store_true")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--mode", choices=("fetch", "iter", "file"), default="fetch")
    parser.add_argument("--out", default="/dev/null")
    parser.add_argument("--pythonpath", help="directory holding the ckptd package")
    parser.add_argument("--no-malloc-tuning", action="store_true")
    parser.add_argument("--stdin-passes", action="store_true",
                        help="one pass per 'go' line on stdin (see the module's docstring)")
    args = parser.parse_args()
    if args.pythonpath:
        sys.path.insert(0, args.pythonpath)
    import ckptd
    import ckptd.malloc_tuning

    tuned = not args.no_malloc_tuning and ckptd.malloc_tuning.tune_malloc_for_streaming()

    if args.merged == bool(args.dst_strategy):
        parser.error("give either --dst-strategy with --ranks, or --merged")
    ranks = [None] if args.merged else parse_ranks(args.ranks)
    if not ranks:
        parser.error("--ranks is empty")
    client = ckptd.Client(args.server)
    path = "native" if client.native_fetch else "grpcio"

    def fetch_rank(rank):
        kwargs = {"merged": True} if args.merged else {"dst_strategy": args.dst_strategy,
                                                        "rank": rank}
        if args.mode == "fetch":
            tensors = client.fetch(args.checkpoint, **kwargs)
            return sum(a.nbytes for a in tensors.values())
        if args.mode == "iter":
            total = 0
            for _, array in client.iter_fetch(args.checkpoint, **kwargs):
                total += array.nbytes
            return total
        return client.fetch_to_file(args.checkpoint, path=args.out, **kwargs).total_bytes

    def one_pass():
        start = time.perf_counter()
        sizes = [fetch_rank(r) for r in ranks]
        return sizes, time.perf_counter() - start

    baseline_rss = rss_bytes()
    if args.stdin_passes:
        print("ready", flush=True)
        commands = (line.strip() for line in sys.stdin)
        more = lambda: next(commands, "quit") == "go"  # noqa: E731
    else:
        budget = [args.passes + 1]

        def more():
            budget[0] -= 1
            return budget[0] >= 0

    def reported_pass():
        sizes, seconds = one_pass()
        if args.stdin_passes:
            print(json.dumps({"gibps": sum(sizes) / seconds / (1 << 30), "bytes": sum(sizes),
                              "seconds": seconds, "path": path}), flush=True)
        return sizes, seconds

    if not more():
        parser.error("no pass was run")
    sizes, seconds = reported_pass()
    warmup = sum(sizes) / seconds / (1 << 30)
    passes = []
    cpu_start = os.times()
    while more():
        sizes, seconds = reported_pass()
        passes.append(sum(sizes) / seconds / (1 << 30))
    cpu_end = os.times()
    cpu = (cpu_end.user - cpu_start.user) + (cpu_end.system - cpu_start.system)
    gib = sum(sizes) * len(passes) / (1 << 30)
    json.dump({
        "checkpoint": args.checkpoint,
        "dst_strategy": args.dst_strategy,
        "ranks": ranks,
        "mode": args.mode,
        "bytes": sum(sizes),
        "max_rank_bytes": max(sizes),
        "passes_gibps": passes,
        "gibps": statistics.median(passes) if passes else warmup,
        "warmup_gibps": warmup,
        "cpu_seconds_per_gib": cpu / gib if gib > 0 else None,
        "baseline_rss_bytes": baseline_rss,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "malloc_tuning": bool(tuned),
        "path": path,
    }, sys.stdout)
    sys.stdout.write("\n")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
