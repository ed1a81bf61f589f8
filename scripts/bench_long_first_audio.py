"""First audio of a long text (cut into segments) against one sentence's, streamed, interleaved.

    .venv/bin/python scripts/bench_long_first_audio.py ARTIFACT [--rounds 5] [--threads 2] [--chars 4000]

One process, one `Pipeline` on ARTIFACT (an artifact folder, e.g. a published int8-dynamic-kv8). Each
round streams the one-sentence request and the long request (ABAB..., A first in odd rounds, B first in
even ones) with the same seed and speaker, and times from the call to the first chunk holding audio:
the long request's time includes normalizing and segmenting its whole text and, with refinement, the
refinement of its first segment only. Prints each side's median and the median of the per-round
ratios long / short.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

SENTENCE = "您好，您的订单已发货，预计 3 天内送达，请注意查收。"
PARAGRAPH = ("您好，您的订单号是 20261206，金额 ¥199.50，已于 12 月 6 日 10:05 发货。预计 3 天内送达，"
             "快递单号 SF1234567890，请注意查收。如需帮助，请拨打 400-123-4567 或回复 1 转人工客服。"
             "Your order ships today; call +1 555 123 4567 if it is late. ")


def first_audio_s(pipe, text: str, params) -> float:
    t = time.perf_counter()
    for chunk in pipe.stream([text], params):
        if len(chunk[0]):
            return time.perf_counter() - t
    return float("nan")


def main() -> None:
    from chattts_forge.runtime.pipeline import InferCodeParams, Pipeline, RefineTextParams, SynthParams

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chars", type=int, default=4000)
    ap.add_argument("--refine", action="store_true", help="refine (each segment in its turn), as synth's default")
    args = ap.parse_args()
    pipe = Pipeline(args.artifact, threads=args.threads)
    long = (PARAGRAPH * (args.chars // len(PARAGRAPH) + 1))[: args.chars]
    params = SynthParams(code=InferCodeParams(seed=0, spk_emb=pipe.random_speaker(0)),
                         refine=RefineTextParams(seed=0) if args.refine else None)
    segments, _ = pipe.normalize_texts([long], params)
    print(f"long request: {len(long)} characters, {len(segments)} segments; short: {len(SENTENCE)} characters")
    first_audio_s(pipe, SENTENCE, params)  # warm-up: sessions, allocators
    short, longs, ratios = [], [], []
    for r in range(args.rounds):
        order = (SENTENCE, long) if r % 2 == 0 else (long, SENTENCE)
        got = {text: first_audio_s(pipe, text, params) for text in order}
        short.append(got[SENTENCE])
        longs.append(got[long])
        ratios.append(got[long] / got[SENTENCE])
        print(f"round {r + 1}: one sentence {got[SENTENCE]:.3f} s, {len(long)} characters {got[long]:.3f} s")
    print(f"first audio, median of {args.rounds}: one sentence {statistics.median(short):.3f} s, "
          f"{len(long)} characters {statistics.median(longs):.3f} s; ratio {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
