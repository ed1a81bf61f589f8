"""`chattts-forge reference`: synthesize with ChatTTS's own PyTorch code (the parity oracle)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from chattts_forge.cli_options import sampling_options
from chattts_forge.errors import ForgeError
from chattts_forge.fsutil import atomic_write_text
from chattts_forge.log import get_logger

log = get_logger(__name__)


@click.command("reference")
@click.option(
    "--checkpoint",
    "checkpoint",
    required=True,
    type=click.Path(path_type=Path),
    help="ChatTTS checkpoint: asset folder, snapshot root containing asset/, or a Hugging Face cache.",
)
@click.option("--text", "text", required=True, help="Text to speak (ChatTTS splits it into sentences unless --no-split).")
@click.option(
    "--out", "out", required=True, type=click.Path(path_type=Path), help="Output WAV (float32, mono)."
)
@click.option("--seed", type=int, default=None, help="Seed torch and ChatTTS's manual_seed (reproducible).")
@click.option(
    "--speaker-out",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the speaker string used (useful with --speaker random).",
)
@sampling_options
@click.option("--max-new-token", type=int, default=2048, show_default=True, help="Most code steps per part.")
@click.option(
    "--refine/--no-refine", default=True, show_default=True, help="Refine the text with the GPT first."
)
@click.option(
    "--split/--no-split",
    "split_text",
    default=True,
    show_default=True,
    help="Chat.infer's split_text: speak sentence by sentence (the first one sets the voice of the rest).",
)
@click.option(
    "--codes-out",
    type=click.Path(path_type=Path),
    default=None,
    help="Save the generated audio codes as an int64 .npy array [steps, 4].",
)
@click.option("--device", default="cpu", show_default=True, help="torch device (cpu, cuda, cuda:1, ...).")
@click.option(
    "--progress/--no-progress", default=None, help="ChatTTS's progress bars (default: when stderr is a tty)."
)
def reference(
    checkpoint: Path,
    text: str,
    out: Path,
    seed: int | None,
    speaker: str | None,
    speaker_out: Path | None,
    temperature: float,
    top_p: float,
    top_k: int,
    repetition_penalty: float,
    max_new_token: int,
    min_new_token: int,
    refine: bool,
    split_text: bool,
    use_decoder: bool,
    codes_out: Path | None,
    device: str,
    progress: bool | None,
) -> None:
    """Synthesize TEXT with ChatTTS's own PyTorch `Chat.infer` from a checkpoint.

    This is the reference every ONNX artifact is checked against. Defaults are ChatTTS's own
    (InferCodeParams); a synthetic `tiny` checkpoint loads with its own dimensions.

    \b
    Example:
      chattts-forge reference --checkpoint ckpt/ --text "你好。" --seed 0 --no-refine \\
          --temperature 1e-9 --codes-out codes.npy --out ref.wav
    """
    if not text.strip():
        raise ForgeError("--text is empty")
    if out.is_dir():
        raise ForgeError(f"--out {out} is a folder; give a .wav file path")
    if speaker_out is not None and speaker is None:
        raise ForgeError("--speaker-out needs --speaker (a string or 'random')")
    device = device.strip()
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ForgeError(f"--device {device}: CUDA is not available to torch on this machine")
    elif device != "cpu":
        raise ForgeError(f"--device {device}: use cpu or cuda[:N]")

    from chattts_forge.torch_ref.chat import load_chat
    from chattts_forge.torch_ref.reference import reference_synthesize, write_codes, write_wav

    t0 = time.perf_counter()
    chat = load_chat(checkpoint, device=device)
    t1 = time.perf_counter()
    res = reference_synthesize(
        chat,
        text,
        seed=seed,
        speaker=speaker,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        repetition_penalty=repetition_penalty,
        max_new_token=max_new_token,
        min_new_token=min_new_token,
        refine=refine,
        split_text=split_text,
        use_decoder=use_decoder,
        show_progress=sys.stderr.isatty() if progress is None else progress,
    )
    t2 = time.perf_counter()
    write_wav(out, res.wav, res.sample_rate)
    log.info(
        "wrote %s: %.2f s of audio at %d Hz, %d code steps (load %.1f s, synthesis %.1f s)",
        out,
        res.wav.size / res.sample_rate,
        res.sample_rate,
        len(res.codes),
        t1 - t0,
        t2 - t1,
    )
    if codes_out is not None:
        write_codes(codes_out, res.codes)
        log.info("wrote codes %s: shape %s", codes_out, tuple(res.codes.shape))
    if speaker_out is not None:
        assert res.speaker is not None
        atomic_write_text(speaker_out, res.speaker + "\n")
        log.info("wrote speaker string %s", speaker_out)
