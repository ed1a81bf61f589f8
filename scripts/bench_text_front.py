"""Time the text front end: the spoken form (runtime.spoken) + segmentation (runtime.segments) per sentence.

    .venv/bin/python scripts/bench_text_front.py [--repeat 5] [--json out.json]

In one process, after one warm-up pass, it times `TextFront`'s work on every sentence of the case table
(tests/data/spoken_cases.tsv), the shipped phrase list and the evaluation corpus, normalization on
and off, interleaved sentence by sentence, and prints the median and p95 of each and of their
difference. A cold process's first normalization is timed separately (`--cold N` fresh processes per
case: a sentence with digits in Chinese, in English, and plain words), as the time from the
normalizer's import to its first output, beside the same process's `import chattts_forge.runtime`.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COLD_CASES = {"zh digits": "转人工请按 0，订单号 20261206。", "en digits": "Call 555-0123 at 3:30 pm on Dec 8, 2026.",
              "plain words": "你好，欢迎使用。"}
_COLD = """
import time, json, sys
t0 = time.perf_counter()
from chattts_forge.runtime.chattts_text import Normalizer
from chattts_forge.runtime.segments import split_segments
from chattts_forge.runtime.spoken import SPOKEN
t1 = time.perf_counter()
text, chat = SPOKEN.normalize(sys.argv[1]), Normalizer({})
split_segments(chat(text))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_s": t2 - t1}))
"""


def sentences() -> list[str]:
    out = []
    with open(ROOT / "tests/data/spoken_cases.tsv", encoding="utf-8") as f:
        out += [row["input"] for row in csv.DictReader(f, delimiter="\t")]
    out += [line.strip() for line in (ROOT / "calibration_data/phrases/v1/customer_service.txt").read_text(
        encoding="utf-8").splitlines() if line.strip()]
    for p in sorted((ROOT / "calibration_data/corpora/v1/evaluation").glob("*.txt")):
        out += [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    return out


def front(text: str, normalize: bool) -> list[str]:
    from chattts_forge.runtime.chattts_text import Normalizer
    from chattts_forge.runtime.segments import split_segments
    from chattts_forge.runtime.spoken import SPOKEN

    chat = _CHAT.setdefault("n", Normalizer({}))
    spoken = SPOKEN.normalize(text) if normalize else text
    return split_segments(chat(spoken)) if normalize else [chat(spoken)]


_CHAT: dict[str, object] = {}
_NEEDS = re.compile(r"[0-9$€£¥￥%°℃+×÷=@#&*/−]")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cold", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    texts = sentences()
    for t in texts:  # warm-up: grammars read, caches filled
        front(t, True)
        front(t, False)
    on: list[float] = []
    off: list[float] = []
    for _ in range(args.repeat):
        for t in texts:
            a = time.perf_counter()
            front(t, True)
            b = time.perf_counter()
            front(t, False)
            c = time.perf_counter()
            on.append(b - a)
            off.append(c - b)
    diff = [x - y for x, y in zip(on, off, strict=True)]
    marked = [i for i, t in enumerate(texts * args.repeat) if _NEEDS.search(t)]  # digits, symbols: the grammars run
    on_marked = [on[i] for i in marked]
    result = {"sentences": len(texts), "repeat": args.repeat,
              "on_ms": {"median": 1e3 * statistics.median(on), "p95": 1e3 * pct(on, 0.95)},
              "off_ms": {"median": 1e3 * statistics.median(off), "p95": 1e3 * pct(off, 0.95)},
              "added_ms": {"median": 1e3 * statistics.median(diff), "p95": 1e3 * pct(diff, 0.95)},
              "with_digits_or_symbols": {"sentences": len(marked) // args.repeat,
                                         "on_ms": {"median": 1e3 * statistics.median(on_marked),
                                                   "p95": 1e3 * pct(on_marked, 0.95)}},
              "cold": {}}
    for name, text in COLD_CASES.items():
        runs = [json.loads(subprocess.run([sys.executable, "-c", _COLD, text], check=True, capture_output=True,
                                          text=True).stdout) for _ in range(args.cold)]
        result["cold"][name] = {k: 1e3 * statistics.median(r[k] for r in runs) for k in ("import_s", "first_s")}
    print(f"{len(texts)} sentences x {args.repeat}: normalization + segmentation "
          f"{result['on_ms']['median']:.2f} ms median ({result['on_ms']['p95']:.2f} p95); ChatTTS's own front end "
          f"{result['off_ms']['median']:.3f} ms; added {result['added_ms']['median']:.2f} ms median "
          f"({result['added_ms']['p95']:.2f} p95)")
    m = result["with_digits_or_symbols"]
    print(f"the {m['sentences']} sentences with digits or symbols: {m['on_ms']['median']:.2f} ms median "
          f"({m['on_ms']['p95']:.2f} p95)")
    for name, c in result["cold"].items():
        print(f"cold process, {name}: first normalization {c['first_s']:.1f} ms (median of {args.cold}; "
              f"the imports before it {c['import_s']:.0f} ms)")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
