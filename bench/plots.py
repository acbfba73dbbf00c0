"""Benchmark plots as PNG files: latency CDFs per phase, and latency per window over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, PercentFormatter

# A Figure drawn on its own Agg canvas: no pyplot, so no global figure state and no GUI
# backend is ever looked for (the benches run headless).


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)


def _ms(value: float, _pos: object) -> str:
    return f"{value:g}"


def _ms_2_5(value: float, _pos: object) -> str:
    """Between the powers of ten of a log axis, label 2 and 5 only (20, 50, 200...)."""
    return f"{value:g}" if f"{value:e}"[0] in "25" else ""


def _log_ms_axis(axis: Axis) -> None:
    axis.set_major_formatter(FuncFormatter(_ms))
    axis.set_minor_formatter(FuncFormatter(_ms_2_5))


def latency_cdf(
    path: Path,
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    title: str,
    floors: Mapping[str, str] | None = None,
) -> None:
    """One line per phase: the share of its calls answered within x ms (log scale).

    ``series``: (label, latencies in ms). A failed call should be passed at its deadline, so
    a phase's line reaches 100% only where every call was answered in time. ``floors``:
    floor label -> the label of the phase it is the floor of; a floor is drawn dashed in
    that phase's colour.
    """
    floors = floors or {}
    fig = Figure(figsize=(10, 6), layout="constrained")
    ax = fig.add_subplot()
    colors: dict[str, str] = {}
    for label, values in series:
        ms = np.sort(np.asarray(values, dtype=np.float64))
        ms = ms[np.isfinite(ms) & (ms > 0)]
        if ms.size == 0:
            continue
        share = np.arange(1, ms.size + 1) / ms.size
        key = floors.get(label, label)
        color = colors.setdefault(key, f"C{len(colors) % 10}")
        style = "--" if label in floors else "-"
        ax.step(ms, share, style, where="post", label=label, color=color, linewidth=1.4)
    ax.set_xscale("log")
    _log_ms_axis(ax.xaxis)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    for q in (0.5, 0.95, 0.99):
        ax.axhline(q, color="0.8", linewidth=0.8, zorder=0)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("latency from the scheduled start (ms, log scale)")
    ax.set_ylabel("calls answered within x")
    ax.set_title(title)
    ax.grid(True, which="both", axis="x", color="0.92")
    ax.legend(loc="lower right", fontsize="small")
    _save(fig, path)


def latency_over_time(
    path: Path,
    window_starts_s: Sequence[float],
    lines: Sequence[tuple[str, Sequence[float | None]]],
    *,
    title: str,
    rss: Sequence[tuple[float, float]] = (),
    traffic_s: float | None = None,
) -> None:
    """Latency per window (one line per RPC and percentile), and the server's RSS below it.

    ``lines``: (label, one value in ms per window, None where the window had no call);
    ``traffic_s``: when the calls stopped (the RSS goes on while the workers drain).
    """
    fig = Figure(figsize=(10, 7 if rss else 5), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1)) if rss else [fig.add_subplot()]
    ax = axes[0]
    colors: dict[str, str] = {}
    for label, values in lines:
        ys = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
        # One colour per RPC (the label's first word); p99 dashed, beside its p50.
        color = colors.setdefault(label.split()[0], f"C{len(colors) % 10}")
        style = "--" if "p99" in label else "-"
        ax.plot(window_starts_s, ys, style, color=color, marker="o", markersize=3, label=label)
    ax.set_yscale("log")
    _log_ms_axis(ax.yaxis)
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title(title)
    ax.grid(True, which="both", color="0.92")
    ax.legend(loc="upper left", fontsize="small", ncol=2)
    if rss:
        ts, mb = zip(*rss, strict=True)
        axes[1].plot(ts, mb, color="0.3")
        axes[1].set_ylabel("server RSS (MB)")
        axes[1].grid(True, color="0.92")
    if traffic_s is not None:
        for a in axes:
            a.axvline(traffic_s, color="0.5", linestyle=":", linewidth=1)
        axes[-1].annotate(
            "calls stop",
            (traffic_s, 0),
            xycoords=("data", "axes fraction"),
            xytext=(-3, 3),
            textcoords="offset points",
            horizontalalignment="right",
            fontsize="small",
            color="0.4",
        )
    axes[-1].set_xlabel("time since the traffic started (s; a point per window, at its start)")
    _save(fig, path)
