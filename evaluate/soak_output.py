"""What a soak test prints (`format_soak`) and draws (`plot`) from its report (`soak.run_soak`)."""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from chattts_forge.fsutil import atomic_write_bytes


def plot(report: dict[str, Any], out: str | os.PathLike[str]) -> None:
    """RSS, fds and threads, queue, per-window p50/p99 over time (reloads marked), as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    axes[0].plot(t, [s.get("rss", np.nan) / 2**20 for s in samples], label="RSS (MiB)")
    axes[0].set_ylabel("RSS MiB")
    axes[1].plot(t, [s.get("fds", np.nan) for s in samples], label="open fds")
    axes[1].plot(t, [s.get("threads", np.nan) for s in samples], label="threads")
    axes[1].legend(loc="upper left")
    axes[2].plot(t, [s.get("queue", np.nan) for s in samples], label="queue depth")
    axes[2].plot(t, [s.get("running", np.nan) for s in samples], label="running rows")
    axes[2].legend(loc="upper left")
    w = report["windows"]
    wt = [(x["start_s"] + report["config"]["window_s"] / 2) / 60 for x in w]
    axes[3].plot(wt, [x["p50_s"] if x["p50_s"] is not None else np.nan for x in w], "o-", label="p50 (misses)")
    axes[3].plot(wt, [x["p99_s"] if x["p99_s"] is not None else np.nan for x in w], "o-", label="p99 (misses)")
    axes[3].set_ylabel("latency s")
    axes[3].set_xlabel("minutes")
    axes[3].legend(loc="upper left")
    for r in report["reloads"]:
        for ax in axes:
            ax.axvline(r["t"] / 60, color="grey" if r["status"] == 200 else "red", lw=0.6, ls="--")
    fig.suptitle(f"soak: {report['requests']} requests, {report['lost_healthy']} healthy lost, "
                 f"{len(report['reloads'])} reloads")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())


def format_soak(report: dict[str, Any]) -> str:
    d = report["drift"]

    def mib(x: float | None) -> str:
        return "-" if x is None else f"{x / 2**20:.0f} MiB"

    def num(x: float | None, f: str = "{:.2f}") -> str:
        return "-" if x is None else f.format(x)

    lines = [
        f"soak {report['wall_s']:.0f} s: {report['requests']} requests ({report['healthy']} healthy, "
        f"{report['lost_healthy']} lost; malformed not 4xx: {report['malformed_not_4xx']}; "
        f"reloads {len(report['reloads'])}, failed {report['failed_reloads']})",
        "by kind: " + ", ".join(f"{k} {v['ok']}/{v['sent']}" for k, v in report["by_kind"].items()),
        f"RSS early {mib(d['rss_early_bytes'])}, late {mib(d['rss_late_bytes'])} "
        f"(x{num(d['rss_late_over_early'], '{:.3f}')}), peak {mib(d['rss_peak_bytes'])}",
        f"fds {num(d['fds_first'], '{:.0f}')} -> {num(d['fds_last'], '{:.0f}')} (max {num(d['fds_max'], '{:.0f}')}); "
        f"threads {num(d['threads_first'], '{:.0f}')} -> {num(d['threads_last'], '{:.0f}')} "
        f"(max {num(d['threads_max'], '{:.0f}')})",
        f"p99 reference {num(d['p99_reference_s'])} s; worst later window x{num(d['p99_max_window_over_reference'])}",
        f"misses {num(report['misses_per_s'], '{:.3f}')}/s; admitted p99 {num(report['admitted_p99_s'])} s; refusals "
        f"{report['refusals']['count']} (Retry-After {num(report['refusals']['retry_after_min_s'], '{:.0f}')}-"
        f"{num(report['refusals']['retry_after_max_s'], '{:.0f}')} s), all retried until admitted: "
        f"{report['lost_healthy'] == 0}",
    ]
    return "\n".join(lines)
