"""Measure time-scale modification (TSM) candidates for the server's `speed` on real speech.

For each candidate and speed: the duration ratio out/in against 1/speed, DNSMOS (P.835 OVRL, SIG,
BAK and P.808) of the result, CPU seconds per second of input audio, and whether it streams (chunk
in, chunk out) with what algorithmic latency (input pushed before the first output sample, measured
with 100 ms chunks where the candidate streams). The speech: Flite's four built-in voices
(tests/data/speech/voices, 16 kHz, made by scripts/make_voice_data.py), resampled to the server's
24 kHz.

Candidates (each skipped with a note when its package is missing):
- atempo: ffmpeg's atempo (WSOLA) in process through PyAV, stages within 0.5..2 (runtime.tempo).
- audiotsm-wsola, audiotsm-pv: the `audiotsm` package's WSOLA and phase vocoder (numpy).
- rubberband-r3: Rubber Band's R3 (finer) engine, offline, through `pedalboard.time_stretch`.
- rubberband-rt: Rubber Band's R3 engine in real-time mode, through `pylibrb`.

Usage: python scripts/measure_tempo.py [--clips 2] [--out docs/measurements/2026-12-06-tempo/README.md]
(needs scipy and the DNSMOS models: pip install --no-deps speechmos==0.0.1.1; the text after the
report's `<!-- choice -->` line is kept when it is rewritten).
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
VOICES = ROOT / "tests" / "data" / "speech" / "voices"
SPEEDS = (0.25, 0.5, 0.75, 1.25, 1.5, 2.0, 3.0, 4.0)
RATE = 24000
CHUNK = 2400  # 100 ms: the chunk the streaming candidates are fed in the latency figure


def load_clips(per_voice: int) -> list[np.ndarray]:
    from scipy.signal import resample_poly

    clips = []
    for voice in ("slt", "rms", "awb", "kal16"):
        for path in sorted((VOICES / voice).glob("*.wav"))[:per_voice]:
            wav, sr = sf.read(path, dtype="float32")
            assert sr == 16000, path
            clips.append(resample_poly(wav, 3, 2).astype(np.float32))
    return clips


# ---- candidates: (whole function, streaming latency function or None) ---------------------------

def atempo_whole(wav: np.ndarray, speed: float) -> np.ndarray:
    from chattts_forge.runtime.tempo import stretch

    return stretch(wav, speed, RATE)


def atempo_latency(wav: np.ndarray, speed: float) -> int:
    from chattts_forge.runtime.tempo import Stretcher

    s = Stretcher(speed, RATE)
    for pos in range(0, len(wav), CHUNK):
        if len(s.push(wav[pos:pos + CHUNK])):
            return min(pos + CHUNK, len(wav))
    return len(wav)


def audiotsm_whole(kind: str) -> Callable[[np.ndarray, float], np.ndarray]:
    def run(wav: np.ndarray, speed: float) -> np.ndarray:
        import audiotsm
        from audiotsm.io.array import ArrayReader, ArrayWriter

        writer = ArrayWriter(1)
        getattr(audiotsm, kind)(1, speed=speed).run(ArrayReader(wav[None, :]), writer)
        return writer.data[0].astype(np.float32)
    return run


def audiotsm_latency(kind: str) -> Callable[[np.ndarray, float], int]:
    def run(wav: np.ndarray, speed: float) -> int:
        import audiotsm
        from audiotsm.io.array import ArrayReader, ArrayWriter

        tsm = getattr(audiotsm, kind)(1, speed=speed)
        writer = ArrayWriter(1)
        for pos in range(0, len(wav), CHUNK):
            reader = ArrayReader(wav[None, pos:pos + CHUNK])
            while not reader.empty:
                tsm.read_from(reader)
                tsm.write_to(writer)
            if writer.data.shape[1]:
                return min(pos + CHUNK, len(wav))
        return len(wav)
    return run


def rubberband_r3(wav: np.ndarray, speed: float) -> np.ndarray:
    import pedalboard

    out = pedalboard.time_stretch(wav[None, :], RATE, stretch_factor=speed)
    return np.asarray(out[0], np.float32)


def _rubberband_rt(wav: np.ndarray, speed: float, first_only: bool) -> np.ndarray | int:
    import pylibrb

    opts = pylibrb.Option.PROCESS_REALTIME | pylibrb.Option.ENGINE_FINER
    s = pylibrb.RubberBandStretcher(RATE, 1, opts, initial_time_ratio=1.0 / speed)
    pad = s.get_preferred_start_pad()
    delay = s.get_start_delay()
    x = np.concatenate([np.zeros(pad, np.float32), wav])
    outs, got = [], 0
    for pos in range(0, len(x), CHUNK):
        s.process(np.ascontiguousarray(x[None, pos:pos + CHUNK]), final=pos + CHUNK >= len(x))
        out = s.retrieve_available()[0]
        outs.append(out)
        got += len(out)
        if first_only and got > delay:
            return max(0, min(pos + CHUNK, len(x)) - pad)
    while s.available() > 0:
        outs.append(s.retrieve_available()[0])
    return len(wav) if first_only else np.concatenate(outs)[delay:].astype(np.float32)


def rubberband_rt_whole(wav: np.ndarray, speed: float) -> np.ndarray:
    return _rubberband_rt(wav, speed, False)  # type: ignore[return-value]


def rubberband_rt_latency(wav: np.ndarray, speed: float) -> int:
    return _rubberband_rt(wav, speed, True)  # type: ignore[return-value]


CANDIDATES = {
    "atempo": ("av", atempo_whole, atempo_latency),
    "audiotsm-wsola": ("audiotsm", audiotsm_whole("wsola"), audiotsm_latency("wsola")),
    "audiotsm-pv": ("audiotsm", audiotsm_whole("phasevocoder"), audiotsm_latency("phasevocoder")),
    "rubberband-r3": ("pedalboard", rubberband_r3, None),
    "rubberband-rt": ("pylibrb", rubberband_rt_whole, rubberband_rt_latency),
}


def version_of(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    dist = {"av": "av"}.get(module, module)
    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def measure(clips: list[np.ndarray], names: list[str]) -> tuple[list[dict], dict]:
    from chattts_forge.evaluate.naturalness import Dnsmos

    dnsmos = Dnsmos.load()
    keys = ("ovrl", "sig", "bak", "p808")

    def mos(wavs: list[np.ndarray]) -> dict[str, float]:
        scores = [dnsmos.score(w, RATE) for w in wavs]
        return {k: float(np.mean([s[k] for s in scores])) for k in keys}

    reference = mos(clips)
    seconds_in = sum(len(c) for c in clips) / RATE
    rows = []
    for name in names:
        module, whole, latency = CANDIDATES[name]
        try:
            __import__(module)
        except ModuleNotFoundError:
            print(f"{name}: {module} not installed, skipped", file=sys.stderr)
            continue
        for speed in SPEEDS:
            t0 = time.process_time()
            outs = [whole(c, speed) for c in clips]
            cpu = time.process_time() - t0
            ratio = sum(len(o) for o in outs) / sum(len(c) for c in clips)
            lat = [latency(c, speed) for c in clips] if latency else None
            row = {"candidate": name, "speed": speed, "ratio": ratio, "target": 1.0 / speed,
                   "cpu_ms_per_s": 1000.0 * cpu / seconds_in,
                   "latency_ms": None if lat is None else 1000.0 * float(np.median(lat)) / RATE, **mos(outs)}
            rows.append(row)
            print(f"{name:15s} {speed:5.2f} ratio {ratio:.4f} (1/speed {1 / speed:.4f}) ovrl {row['ovrl']:.2f} "
                  f"p808 {row['p808']:.2f} cpu {row['cpu_ms_per_s']:.1f} ms/s", file=sys.stderr, flush=True)
    return rows, reference


def write_report(path: Path, rows: list[dict], reference: dict, clips: int, command: str) -> None:
    lines = [
        "# Time-scale modification for the server's `speed` (2026-12-06)",
        "",
        "OpenAI's `speed` divides the duration by `speed` with pitch and voice kept. The server synthesises",
        "at speed 1 and changes the tempo of the waveform afterwards (`runtime/tempo.py`). This compares the",
        "candidates on real speech: Flite 2.2's four built-in voices (`tests/data/speech/voices/`: slt, rms,",
        f"awb, kal16; {clips} clips, 16 kHz resampled to the server's 24 kHz).",
        "",
        f"- Machine: {cpu_model()} (CPU only), Python {platform.python_version()}.",
        "- Packages: " + ", ".join(f"{m} {version_of(m)}" for m in ("av", "audiotsm", "pedalboard", "pylibrb")) + ".",
        f"- Command: `{command}` (the other candidates are no project dependencies: "
        "`pip install audiotsm==0.1.2 pedalboard==0.9.26 pylibrb==0.1.2`; scipy resamples the clips)",
        "",
        "Columns: `out/in`: total output samples over total input samples (the goal is `1/speed`);",
        "DNSMOS P.835 OVRL, SIG, BAK and P.808 (`chattts_forge.evaluate.naturalness`), the mean over the",
        "clips; `CPU ms/s`: CPU milliseconds per second of input audio (all clips, one pass);",
        "`latency ms`: input pushed (in 100 ms chunks) before the first output sample, median over the",
        "clips; `-`: the candidate has no streaming interface here.",
        "",
        f"The input clips themselves score OVRL {reference['ovrl']:.2f}, SIG {reference['sig']:.2f}, "
        f"BAK {reference['bak']:.2f}, P.808 {reference['p808']:.2f}.",
        "",
        "| candidate | speed | 1/speed | out/in | OVRL | SIG | BAK | P.808 | CPU ms/s | latency ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lat = "-" if r["latency_ms"] is None else f"{r['latency_ms']:.0f}"
        lines.append(f"| {r['candidate']} | {r['speed']:g} | {r['target']:.3f} | {r['ratio']:.3f} | {r['ovrl']:.2f} | "
                     f"{r['sig']:.2f} | {r['bak']:.2f} | {r['p808']:.2f} | {r['cpu_ms_per_s']:.1f} | {lat} |")
    lines.append("")
    lines.append("## Mean over the speeds")
    lines.append("")
    lines.append("| candidate | OVRL | P.808 | worst \\|out/in x speed - 1\\| | CPU ms/s |")
    lines.append("|---|---|---|---|---|")
    for name in dict.fromkeys(r["candidate"] for r in rows):
        sub = [r for r in rows if r["candidate"] == name]
        worst = max(abs(r["ratio"] * r["speed"] - 1) for r in sub)
        lines.append(f"| {name} | {np.mean([r['ovrl'] for r in sub]):.2f} | {np.mean([r['p808'] for r in sub]):.2f} | "
                     f"{100 * worst:.1f}% | {np.mean([r['cpu_ms_per_s'] for r in sub]):.1f} |")
    lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    marker = "<!-- choice -->"
    tail = ""
    if path.exists() and marker in path.read_text():
        tail = path.read_text().split(marker, 1)[1]
    path.write_text("\n".join(lines) + "\n" + marker + tail)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--clips", type=int, default=2, help="clips per voice (4 voices)")
    ap.add_argument("--candidates", default=",".join(CANDIDATES), help="comma-separated names")
    ap.add_argument("--out", type=Path, default=ROOT / "docs/measurements/2026-12-06-tempo/README.md")
    args = ap.parse_args()
    clips = load_clips(args.clips)
    rows, reference = measure(clips, args.candidates.split(","))
    command = "python scripts/measure_tempo.py" + "".join(f" {a}" for a in sys.argv[1:])
    write_report(args.out, rows, reference, len(clips), command)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
