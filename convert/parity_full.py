"""Parity of the runtime against ChatTTS itself on any checkpoint (meant for a `full` one).

    python -m chattts_forge.convert.parity_full --checkpoint CKPT --artifact ART/fp32 [--steps 200]

For zh, en and mixed sentences, with and without a speaker, one text at a time (what
`chattts-forge synth --temperature 1e-9 --no-refine --min-new-token N --max-new-token N` does):

- codes: the runtime's codes against ChatTTS's own `_infer_code` (same InferCodeParams, its
  normaliser, temperature 1e-9). A divergence is admissible only at a near-tie (ChatTTS's top-2
  gap < 1e-5 at the first differing step); it is printed either way;
- waveforms (unless --no-waveforms): the runtime's decode of ChatTTS's hidden states against
  ChatTTS's `_decode_to_wavs` (max abs difference <= 1e-3, same length);
- teacher forcing (with --logits): processed logits fed ChatTTS's codes, within 1e-4.

Prints one line per case and the figures (steps, min top-2 gap, per-step times of both engines);
`--json-out` saves them. Exit status 0 when everything is within the rules, 1 otherwise.
Library use: `run_parity(checkpoint, artifact, ParityConfig(steps=200, ...)) -> dict`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import atomic_write_json
from chattts_forge.log import get_logger, setup_logging
from chattts_forge.options import declared_options, option
from chattts_forge.torch_ref import oracle
from chattts_forge.torch_ref.chat import load_chat
from chattts_forge.torch_ref.compare import compare_codes, compare_processed_logits
from chattts_forge.torch_ref.reference import sample_speaker

log = get_logger(__name__)

TEXTS = {
    "zh": "今天天气很好，我们一起去公园散步吧。",
    "en": "The quick brown fox jumps over the lazy dog.",
    "mixed": "我们用 ChatTTS 合成 speech，效果很好。",
}
SPEAKER_CASES = ("no-speaker", "speaker")
LOGITS_TOL = 1e-4
WAV_TOL = 1e-3


def _texts_named(names: tuple[str, ...]) -> dict[str, str] | None:
    """`--text NAME` (repeatable): those of `TEXTS` (none given: all)."""
    return {k: TEXTS[k] for k in names} if names else None


def _speaker_cases(cases: tuple[str, ...]) -> tuple[str, ...]:
    return cases or SPEAKER_CASES  # none given: both


@dataclass(frozen=True)
class ParityConfig:
    """What `run_parity` checks: `steps` codes per sentence of `texts` (default `TEXTS`), with and
    without a speaker sampled from `speaker_seed` (`speaker_cases`), on `threads` threads; the
    waveforms (`waveforms`) and the teacher-forced logits (`logits`: `logits_steps` steps at
    `logits_temperature`) too.

    Each option of `python -m chattts_forge.convert.parity_full` is declared on its field
    (chattts_forge.options); `checkpoint`, `artifact` and `json_out` (keyword-only) are the command's,
    which `run_parity` takes as arguments instead."""

    checkpoint: Path | None = option(None, "--checkpoint", "ChatTTS checkpoint.", kind="path", required=True,
                                     kw_only=True)
    artifact: Path | None = option(None, "--artifact", "FP32 artifact converted from it.", kind="path",
                                   required=True, kw_only=True)
    steps: int = option(200, "--steps", "N = min = max new tokens.", kind=int, show_default=True)
    texts: dict[str, str] | None = option(
        None, "--text", "Only these sentences (repeatable). Default: all.", choices=tuple(TEXTS), multiple=True,
        convert=_texts_named)
    speaker_seed: int = option(0, "--speaker-seed", "Seed of the sampled speaker.", kind=int, show_default=True)
    threads: int = option(2, "--threads", "Threads of both engines.", kind=int, show_default=True)
    waveforms: bool = option(True, "--waveforms/--no-waveforms", "Also compare waveforms, check (3).",
                             show_default=True)
    logits: bool = option(False, "--logits/--no-logits", "Also check teacher forcing (1).", show_default=True)
    logits_steps: int = 64  # no CLI option
    logits_temperature: float = option(
        1.0, "--logits-temperature",
        "Temperature of the teacher-forced check (processed logits scale with 1/T, and so does FP32 noise).",
        kind=float, show_default=True)
    speaker_cases: tuple[str, ...] = option(
        SPEAKER_CASES, "--speaker-case", "Only these speaker cases (repeatable). Default: both.",
        choices=SPEAKER_CASES, multiple=True, convert=_speaker_cases)
    json_out: Path | None = option(None, "--json-out", "Save the figures as JSON.", kind="path", kw_only=True)


@dataclass
class _Figures:
    """The running totals over the cases."""

    time_ref: float = 0.0
    time_rt: float = 0.0
    total_steps: int = 0
    min_gap: float = float("inf")
    worst_wav: float = 0.0
    worst_logits: float = 0.0
    ok: bool = True


class _ParityRun:
    """ChatTTS and the runtime side by side on one checkpoint and its artifact."""

    def __init__(self, chat: Any, pipe: Any, cfg: ParityConfig, echo: Any) -> None:
        self.chat, self.pipe, self.cfg, self.echo = chat, pipe, cfg, echo
        self.figures = _Figures()

    def codes(self, name: str, label: str, text: str, spk_emb: Any) -> tuple[dict[str, Any], str, dict[str, Any], str]:
        """The codes of both engines: (ChatTTS's result, the normalised text, the case record, its line)."""
        # the runtime package loads soundfile (12 ms): needed only here
        from chattts_forge.runtime import InferCodeParams

        steps, fig = self.cfg.steps, self.figures
        t = time.perf_counter()
        ref = oracle.chattts_codes(
            self.chat, [text], spk_emb=spk_emb, max_new_token=steps, min_new_token=steps, temperature=1e-9
        )
        t_ref = time.perf_counter() - t
        norm = self.pipe.normalize(text)
        if norm != ref["texts"][0]:
            fig.ok = False
            self.echo(f"[{label}] normalisers disagree: ChatTTS {ref['texts'][0]!r}, runtime {norm!r}")
        t = time.perf_counter()
        params = InferCodeParams(spk_emb=spk_emb, temperature=1e-9, max_new_token=steps, min_new_token=steps, seed=0)
        gen = self.pipe.infer_code([norm], params)
        t_rt = time.perf_counter() - t
        [row] = compare_codes(ref, [gen.ids[0]])
        fig.time_ref += t_ref
        fig.time_rt += t_rt
        fig.total_steps += steps
        fig.min_gap = min(fig.min_gap, row.min_gap)
        case: dict[str, Any] = {
            "text": name,
            "speaker": spk_emb is not None,
            "steps": steps,
            "equal": row.equal,
            "first_divergence": row.first_divergence,
            "gap_at_divergence": row.gap_at_divergence,
            "near_tie": row.near_tie,
            "min_top2_gap": row.min_gap,
            "chattts_ms_per_step": 1000 * t_ref / steps,
            "runtime_ms_per_step": 1000 * t_rt / steps,
        }
        fig.ok &= row.ok
        line = f"[{label}] {row.describe()}; ChatTTS {case['chattts_ms_per_step']:.1f} ms/step, "
        line += f"runtime {case['runtime_ms_per_step']:.1f} ms/step"
        return ref, norm, case, line

    def waveform(self, ref: dict[str, Any], case: dict[str, Any]) -> str:
        """The runtime's decode of ChatTTS's hidden states against ChatTTS's own."""
        want = oracle.chattts_decode_to_wavs(self.chat, ref["hiddens"], use_decoder=True)[0]
        got = self.pipe.decode(ref["hiddens"], use_decoder=True)[0]
        same_len = want.shape == got.shape
        diff = float(np.abs(want - got).max()) if same_len else float("inf")
        self.figures.worst_wav = max(self.figures.worst_wav, diff)
        case["wav_max_abs_diff"] = diff
        case["wav_samples"] = [int(want.size), int(got.size)]
        self.figures.ok &= same_len and diff <= WAV_TOL
        return f"; waveform max |diff| {diff:.2e} ({want.size} vs {got.size} samples)"

    def teacher_forced(self, text: str, norm: str, spk_emb: Any, case: dict[str, Any]) -> str:
        """Processed logits of both engines fed the same (ChatTTS-sampled) codes."""
        # the runtime package loads soundfile (12 ms): needed only here
        from chattts_forge.runtime import InferCodeParams

        n, temp = min(self.cfg.logits_steps, self.cfg.steps), self.cfg.logits_temperature
        # ChatTTS samples the codes at its default temperature; both engines are then fed them.
        sampled = oracle.chattts_codes(
            self.chat, [text], spk_emb=spk_emb, max_new_token=n, min_new_token=n // 2, temperature=0.3, seed=5
        )
        tf = oracle.chattts_teacher_forced_logits(
            self.chat, [text], sampled["codes"], spk_emb=spk_emb, min_new_token=n // 2, temperature=temp
        )
        got_l = self.pipe.teacher_forced_logits(
            [norm], sampled["codes"], InferCodeParams(spk_emb=spk_emb, temperature=temp, min_new_token=n // 2)
        )[0]
        mask_diff, diff_l = compare_processed_logits(tf["processed_logits"][0], got_l)
        self.figures.worst_logits = max(self.figures.worst_logits, diff_l)
        case["logits_max_abs_diff"] = diff_l
        case["logits_mask_differences"] = mask_diff
        self.figures.ok &= mask_diff == 0 and diff_l <= LOGITS_TOL
        return f"; teacher-forced logits (T={temp:g}) max |diff| {diff_l:.2e}, mask differences {mask_diff}"

    def case(self, name: str, spk_case: str, text: str, spk_emb: Any) -> dict[str, Any]:
        """One sentence, with or without the speaker: its record, and its line echoed."""
        ref, norm, case, line = self.codes(name, f"{name}/{spk_case}", text, spk_emb)
        if self.cfg.waveforms:
            line += self.waveform(ref, case)
        if self.cfg.logits:
            line += self.teacher_forced(text, norm, spk_emb, case)
        self.echo(line)
        return case

    def summary(self, cases: list[dict[str, Any]]) -> dict[str, Any]:
        fig, cfg = self.figures, self.cfg
        return {
            "cases": len(cases),
            "identical": sum(c["equal"] for c in cases),
            "near_tie_divergences": sum((not c["equal"]) and c["near_tie"] for c in cases),
            "decisions": fig.total_steps * self.pipe.num_vq,
            "min_top2_gap": fig.min_gap,
            "chattts_ms_per_step": 1000 * fig.time_ref / max(fig.total_steps, 1),
            "runtime_ms_per_step": 1000 * fig.time_rt / max(fig.total_steps, 1),
            "wav_max_abs_diff": fig.worst_wav if cfg.waveforms else None,
            "logits_max_abs_diff": fig.worst_logits if cfg.logits else None,
        }


def run_parity(
    checkpoint: str | os.PathLike[str],
    artifact: str | os.PathLike[str],
    config: ParityConfig | None = None,
    echo: Any = print,
) -> dict[str, Any]:
    """Run the checks `config` asks for; returns {"ok": bool, "cases": [...], "figures": {...}}."""
    # torch: the PyTorch side only, 1.9 s to import; the runtime package loads soundfile (12 ms)
    import torch

    from chattts_forge.runtime import Pipeline

    cfg = config or ParityConfig()
    if cfg.steps < 1:
        raise BadInput("--steps must be >= 1")
    texts = cfg.texts or TEXTS
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    chat = load_chat(checkpoint)
    pipe = Pipeline(artifact, provider="cpu", threads=cfg.threads)
    if pipe.dims.to_dict() != chat.forge_dims.to_dict():
        raise ForgeError(f"artifact {artifact} was not converted from a checkpoint with these dimensions")
    echo(f"loaded ChatTTS and the artifact in {time.perf_counter() - t0:.1f} s "
         f"(hidden {pipe.dims.hidden_size}, {pipe.dims.num_hidden_layers} layers, {cfg.threads} threads)")
    spk = sample_speaker(chat, cfg.speaker_seed)
    run = _ParityRun(chat, pipe, cfg, echo)
    cases = [
        run.case(name, spk_case, text, spk_emb)
        for spk_case, spk_emb in (("no-speaker", None), ("speaker", spk))
        if spk_case in cfg.speaker_cases
        for name, text in texts.items()
    ]
    return {"ok": bool(run.figures.ok), "cases": cases, "figures": run.summary(cases)}


@click.command()
@declared_options(ParityConfig)
def main(**options: Any) -> None:
    """Check the runtime's codes (and audio) against ChatTTS itself and print the figures."""
    setup_logging(-1)
    # Every fixed-length run "hits max_new_token" on purpose; that warning is noise here.
    logging.getLogger("chattts_forge.runtime").setLevel(logging.ERROR)
    config = ParityConfig(**options)
    try:
        res = run_parity(config.checkpoint, config.artifact, config, echo=click.echo)
    except ForgeError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    click.echo(json.dumps(res["figures"], indent=2))
    click.echo("PARITY OK" if res["ok"] else "PARITY FAILED")
    if config.json_out is not None:
        atomic_write_json(config.json_out, res)
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
