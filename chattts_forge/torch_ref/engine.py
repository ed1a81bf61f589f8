"""The PyTorch baseline timed: `TorchEngine` runs ChatTTS's own FP32 code on a checkpoint with the
same `run(texts, request)` / `first_audio(text, request)` interface and spans as the runtime's
`runtime.timed_engine.OnnxEngine`, so bench and the evaluate stage compare like with like (the
figures' definitions: `runtime.timing`, docs/bench.md "Definitions").

torch is imported when an engine is built (the torch-free layers import this module inside the
function that asks for the PyTorch baseline).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from chattts_forge.errors import ForgeError
from chattts_forge.runtime.timing import MEL_FRAMES_PER_CODE, Request, RunFigures, first_audio_seconds
from chattts_forge.torch_ref.chat import load_chat, quiet_chattts
from chattts_forge.torch_ref.reference import sample_speaker


class TorchEngine:
    """ChatTTS's PyTorch FP32 pipeline on a checkpoint, the same spans as `OnnxEngine`: ChatTTS's
    normalizer, `Chat._infer_code` (timed GPT forwards via hooks on its LlamaModel) and
    `Chat._decode_to_wavs`, i.e. `Chat.infer` without refinement or sentence splitting. `chat`: an
    already loaded `Chat` of that checkpoint (left as it was after `close()`)."""

    name = "pytorch"

    def __init__(
        self, checkpoint: str | os.PathLike[str] | None, threads: int | None, chat: Any = None, device: str = "cpu"
    ) -> None:
        try:
            # torch: the PyTorch side only; 1.9 s to import
            import torch

        except ImportError as e:  # pragma: no cover - export extra missing
            raise ForgeError(f"the PyTorch baseline needs the export extra ({e}): pip install -e '.[export]'") from None

        if threads:
            torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set in this process
            pass
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ForgeError(f"the PyTorch baseline on {device}: CUDA is not available to torch here")
        self.torch = torch
        # CUDA kernels run asynchronously: the hooks synchronize so a timed forward is its own work.
        self._sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        self.device = device
        t0 = time.perf_counter()
        self.chat = chat if chat is not None else load_chat(checkpoint, device=device)
        self.load_seconds = time.perf_counter() - t0
        extractor = self.chat.config.vocos.feature_extractor.init_args
        self.sample_rate = int(extractor.sample_rate)
        self.hop_length = int(extractor.hop_length)
        self.calls: list[tuple[int, int, float, float]] = []  # (new, context, start, seconds)
        llama = self.chat.gpt.gpt
        self._t0 = 0.0

        def pre(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            self._sync()
            self._t0 = time.perf_counter()

        def post(module: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
            self._sync()
            emb = kwargs.get("inputs_embeds")
            mask = kwargs.get("attention_mask")
            new = int(emb.shape[1]) if emb is not None else 1
            ctx = int(mask.shape[1]) if mask is not None else new
            self.calls.append((new, ctx, self._t0, time.perf_counter() - self._t0))

        self._hooks = [
            llama.register_forward_pre_hook(pre, with_kwargs=True),
            llama.register_forward_hook(post, with_kwargs=True),
        ]

    def close(self) -> None:
        """Remove the timing hooks (the Chat may be shared with the caller)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _params(self, request: Request) -> Any:
        # ChatTTS: the PyTorch reference only; 7.9 s to import
        from ChatTTS.core import Chat

        spk = None if request.speaker_seed is None else sample_speaker(self.chat, request.speaker_seed)
        return Chat.InferCodeParams(
            spk_emb=spk, max_new_token=request.max_new_token, min_new_token=request.min_new_token,
            manual_seed=request.seed, stream_batch=request.stream_batch, show_tqdm=False,
        )

    def run(self, texts: Sequence[str], request: Request, keep_audio: bool = False) -> RunFigures:
        chat = self.chat
        params = self._params(request)
        fig = RunFigures(self.sample_rate, self.hop_length)
        self.calls.clear()
        with quiet_chattts(), self.torch.inference_mode():
            t0 = time.perf_counter()
            norm = [chat.normalizer(t, True, True, None) for t in texts]
            t_code = time.perf_counter()
            result = next(chat._infer_code(norm, False, chat.device, True, params))
            t_dec = time.perf_counter()
            row_codes = [int(ids.shape[0]) for ids in result.ids]  # _decode_to_wavs frees the rows
            wavs = chat._decode_to_wavs(result.hiddens, True)
            t_end = time.perf_counter()
        fig.code_stage_s = t_dec - t_code
        fig.e2e_s = t_end - t0
        fig.steps = row_codes[0] if row_codes else 0
        fig.row_codes = row_codes
        starts = [c[2] for c in self.calls]
        fig.full_step_ms = [(b - a) * 1e3 for a, b in zip(starts[1:], starts[2:], strict=False)]
        fig.add_gpt_calls((n, c, dt) for n, c, _, dt in self.calls)
        wav_rows = np.asarray(wavs, dtype=np.float32).reshape(len(row_codes), -1) if row_codes else np.zeros((0, 0))
        if wav_rows.size == 0:
            raise ForgeError("ChatTTS produced no waveform")
        if keep_audio:  # ChatTTS pads a batch to its longest row: cut each row to its own codes
            fig.wavs = [row[: max(MEL_FRAMES_PER_CODE * c - 1, 0) * self.hop_length] for row, c in
                        zip(wav_rows, row_codes, strict=True)]
        return fig

    def first_audio(self, text: str, request: Request) -> float:
        params = self._params(request)
        with quiet_chattts():
            start = time.perf_counter()
            chunks = self.chat.infer(text, stream=True, skip_refine_text=True, split_text=False,
                                     params_infer_code=params)
            # ChatTTS's stream yields zero-filled chunks before its first real audio
            return first_audio_seconds(chunks, lambda c: bool(np.asarray(c).size and np.abs(c).max() > 0), start)
