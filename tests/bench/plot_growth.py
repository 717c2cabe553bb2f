#!/usr/bin/python3
"""Draws the growth case of a ckpt_bench results JSON as PNG plots.

Usage: plot_growth.py RESULTS_JSON OUT_DIR

Reads the "growth" list ({case, series, op, size, seconds, peak_rss_mib, ...}; see
tests/bench/harness_growth.cc) and writes into OUT_DIR:
  growth-bytes.png    seconds and ckptd peak RSS of upload, fetch and transform against GiB
  growth-tensors.png  seconds and ckptd peak RSS of upload and fetch against the tensor count
  growth-ranks.png    dependency-planning milliseconds against the destination ranks
A plot whose series is absent from the JSON is not written. Each time plot carries a dashed
"linear" reference: the cost per unit of the reference size (the smallest, or 1,000 tensors, or
512 ranks) carried to every size. Exits 2 with a message on unusable input.

Needs Debian's python3-matplotlib (Agg backend: no display).
"""

import json
import os
import sys

GIB = 1024.0**3
COLORS = {"upload": "tab:blue", "fetch": "tab:green", "transform": "tab:red", "deps": "tab:purple"}
# Reproducible files: no timestamp or software version in the PNG's metadata.
PNG_METADATA = {"Software": None}
plt = None  # matplotlib.pyplot, imported by main()


class InputError(Exception):
    pass


def load_growth(path):
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not JSON: {e}") from e
    growth = results.get("growth") if isinstance(results, dict) else None
    if not isinstance(growth, list) or not growth:
        raise InputError(
            f"{path} has no growth results (run ckpt_bench with --cases growth or all)")
    series = {}
    for i, e in enumerate(growth):
        try:
            key = (str(e["series"]), str(e["op"]))
            size, seconds = float(e["size"]), float(e["seconds"])
            rss = e.get("peak_rss_mib")
            rss = None if rss is None else float(rss)
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(f"{path}: growth[{i}] is malformed ({err!r})") from err
        if size <= 0 or seconds < 0:
            raise InputError(f"{path}: growth[{i}] has size {size} and seconds {seconds}")
        series.setdefault(key, []).append((size, seconds, rss, e.get("tensors"), e.get("bytes")))
    for points in series.values():
        points.sort(key=lambda p: p[0])
    return series


def reference_line(ax, points, ref_size, scale_x, scale_y, color):
    """Dashed line: the seconds per unit at ref_size (or the smallest size) times each size."""
    ref = next((p for p in points if p[0] == ref_size), points[0])
    if ref[1] <= 0:
        return
    xs = [p[0] for p in points]
    ax.plot([x * scale_x for x in xs], [ref[1] / ref[0] * x * scale_y for x in xs],
            linestyle="--", linewidth=1, color=color, alpha=0.6)


def time_and_rss(series, name, ops, out_path, xlabel, scale_x, log, ref_size, title):
    present = [op for op in ops if (name, op) in series]
    if not present:
        return None
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    for op in present:
        pts = series[(name, op)]
        xs = [p[0] * scale_x for p in pts]
        ax_t.plot(xs, [p[1] for p in pts], marker="o", color=COLORS[op], label=op)
        reference_line(ax_t, pts, ref_size, scale_x, 1, COLORS[op])
        rss = [(x, p[2]) for x, p in zip(xs, pts) if p[2] is not None]
        if rss:
            ax_m.plot([r[0] for r in rss], [r[1] for r in rss], marker="o", color=COLORS[op],
                      label=op)
    for ax in (ax_t, ax_m):
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        if log:
            ax.set_xscale("log")
    if log:
        ax_t.set_yscale("log")
    else:  # from the origin: a proportional cost is a straight line through it
        ax_t.set_xlim(left=0)
        ax_t.set_ylim(bottom=0)
        ax_m.set_xlim(left=0)
    ax_t.set_ylabel("seconds")
    ax_t.set_title("time (dashed: linear from the reference size)", fontsize=9)
    ax_m.set_ylabel("ckptd peak RSS (MiB)")
    ax_m.set_ylim(bottom=0)
    ax_m.set_title("ckptd peak RSS, each operation in a fresh ckptd", fontsize=9)
    ax_t.legend()
    ax_m.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100, metadata=PNG_METADATA)
    plt.close(fig)
    return out_path


def ranks_plot(series, out_path):
    pts = series.get(("ranks", "deps"))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [p[0] for p in pts]
    ax.plot(xs, [p[1] * 1000 for p in pts], marker="o", color=COLORS["deps"], label="deps --all")
    reference_line(ax, pts, 512, 1, 1000, COLORS["deps"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("destination ranks")
    ax.set_ylabel("milliseconds")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title("Dependency planning, 1000 parameters from 1024 ranks\n"
                 "(dashed: linear from 512 ranks)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100, metadata=PNG_METADATA)
    plt.close(fig)
    return out_path


def main(argv):
    if len(argv) != 3:
        print("usage: plot_growth.py RESULTS_JSON OUT_DIR", file=sys.stderr)
        return 2
    try:
        series = load_growth(argv[1])
    except InputError as e:
        print(f"plot_growth: {e}", file=sys.stderr)
        return 2
    # Imported once the input is known to be usable (matplotlib takes seconds to import).
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    global plt  # pylint: disable=global-statement
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel,redefined-outer-name

    out_dir = argv[2]
    os.makedirs(out_dir, exist_ok=True)
    written = []
    tensors = next((p[3] for p in series.get(("bytes", "upload"), []) if p[3]), None)
    written.append(time_and_rss(
        series, "bytes", ["upload", "fetch", "transform"],
        os.path.join(out_dir, "growth-bytes.png"), "GiB of tensors", 1 / GIB, False, None,
        "Cost against checkpoint bytes" + (f" ({tensors} tensors)" if tensors else "")))
    total = next((p[4] for p in series.get(("tensors", "upload"), []) if p[4]), None)
    written.append(time_and_rss(
        series, "tensors", ["upload", "fetch"], os.path.join(out_dir, "growth-tensors.png"),
        "tensors", 1, True, 1000,
        "Cost against tensor count" + (f" (about {total / 2**20:.0f} MiB)" if total else "")))
    written.append(ranks_plot(series, os.path.join(out_dir, "growth-ranks.png")))
    written = [w for w in written if w]
    if not written:
        print(f"plot_growth: {argv[1]} has no bytes, tensors or ranks series", file=sys.stderr)
        return 2
    for w in written:
        print(w)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
