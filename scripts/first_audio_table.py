"""The table of scripts/bench_first_audio.sh's reports: per arm and concurrency, each round's first audio
p50/p95 (all requests; and without the closed loop's opening burst), sentences/s, in-process and over HTTP.
Usage: python scripts/first_audio_table.py OUT_DIR"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(folder: Path) -> None:
    print("| arm | c | round | where | first audio p50 / p95 s | running p50 / p95 s | sentences/s | wall s |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for path in sorted(folder.glob("*-c*-r*.json"), key=lambda p: (p.stem.split("-")[1], p.stem.split("-")[0], p.stem)):
        arm, level, rnd = path.stem.split("-")
        report = json.loads(path.read_text())
        for c, r in report["results"].items():
            for where, fig in (("HTTP", r.get("http")), ("in-process", r)):
                if fig is None:
                    continue
                fa, run = fig["first_audio_s"], fig.get("first_audio_s_running") or {}
                print(f"| {arm} | {c} | {rnd[1:]} | {where} | {_f(fa['p50'])} / {_f(fa['p95'])} | "
                      f"{_f(run.get('p50'))} / {_f(run.get('p95'))} | {fig['sentences_per_s']:.3f} | {fig['wall_s']:.1f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
