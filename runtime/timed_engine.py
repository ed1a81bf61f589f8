"""The torch-free runtime timed: `OnnxEngine` runs an artifact's `Pipeline` with its GPT step timed, and
`decode_step_call` repeats one decode step at a fixed past (quantize's step prices, autotune).

The figures are defined in `runtime.timing` (docs/bench.md "Definitions"); the PyTorch baseline with
the same interface and spans is `chattts_forge.torch_ref.engine.TorchEngine`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import quiet_logger
from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
from chattts_forge.runtime.timing import Request, RunFigures, first_audio_seconds


class TimedGpt:
    """Wraps the runtime's GPT step object (plain or fast) and times every call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[int, int, float]] = []  # (new positions, context, seconds)

    def reset(self, batch: int) -> None:
        self.inner.reset(batch)

    @property
    def past_length(self) -> int:
        return self.inner.past_length

    def __call__(self, inputs_embeds: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        out = self.inner(inputs_embeds, attention_mask, position_ids)
        self.calls.append((inputs_embeds.shape[1], attention_mask.shape[1], time.perf_counter() - t0))
        return out


class OnnxEngine:
    """The artifact's runtime (`Pipeline`) with its GPT step timed. `engine`: the runtime's GPT
    engine choice (auto | fast | plain, see `runtime.pipeline.ENGINES`); `stream_lookahead`: mel
    frames of right context the stream waits for ("exact"; None: the artifact's recorded look-ahead)."""

    name = "onnx"

    def __init__(
        self,
        artifact: str | os.PathLike[str],
        threads: int | None,
        engine: str = "auto",
        stream_lookahead: int | str | None = None,
        provider: str = "cpu",
    ) -> None:
        t0 = time.perf_counter()
        self.pipe = Pipeline(artifact, provider=provider, threads=threads, engine=engine)
        self.timed = TimedGpt(self.pipe.gpt)  # opens the GPT session: part of loading
        self.pipe.gpt = self.timed
        self.load_seconds = time.perf_counter() - t0
        self.gpt_engine = self.pipe.engine
        # the look-ahead streamed at: the artifact's recorded one unless asked ("exact" -> None, exact)
        self.stream_lookahead = self.pipe.resolve_lookahead(stream_lookahead)
        self.sample_rate = self.pipe.sample_rate
        self.hop_length = self.pipe.hop

    @property
    def gpt_step(self) -> Any:
        """The runtime's own (untimed) GPT step object."""
        return self.timed.inner

    def _params(self, request: Request) -> Any:
        spk = None if request.speaker_seed is None else self.pipe.random_speaker(request.speaker_seed)
        return SynthParams(code=InferCodeParams(
            spk_emb=spk, max_new_token=request.max_new_token, min_new_token=request.min_new_token,
            seed=request.seed, stream_batch=request.stream_batch,
        ))

    def run(self, texts: Sequence[str], request: Request, keep_audio: bool = False) -> RunFigures:
        """Time `synthesize`'s path (normalise, code stage, Decoder + Vocos) on one batch."""
        params = self._params(request)
        # With EOS masked every row hits max_new_token on purpose: the runtime's warning is noise.
        with quiet_logger("chattts_forge.runtime.pipeline", enabled=request.eos_masked):
            return self._run(list(texts), params, keep_audio)

    def _run(self, texts: list[str], params: Any, keep_audio: bool) -> RunFigures:
        fig = RunFigures(self.sample_rate, self.hop_length)
        self.timed.calls.clear()
        t0 = time.perf_counter()
        norm, _ = self.pipe.prepare_texts(texts, params)
        t_code = time.perf_counter()
        state = None
        last = None
        for step_state in self.pipe.iter_infer_code(norm, params.code):
            now = time.perf_counter()
            if last is not None:
                fig.full_step_ms.append((now - last) * 1e3)
            last, state = now, step_state
        if state is None:
            raise ForgeError("the runtime produced no generation step")
        gen = state.result()
        t_dec = time.perf_counter()
        wavs = self.pipe.decode(gen.hiddens, True)
        t_end = time.perf_counter()
        fig.code_stage_s = t_dec - t_code
        fig.e2e_s = t_end - t0
        fig.steps = int(state.steps)
        fig.row_codes = [len(ids) for ids in gen.ids]
        fig.add_gpt_calls(self.timed.calls)
        if any(len(w) == 0 for w in wavs):
            raise BadInput("the runtime produced an empty waveform")
        if keep_audio:
            fig.wavs = [np.asarray(w, dtype=np.float32) for w in wavs]
        return fig

    def first_audio(self, text: str, request: Request) -> float:
        params = self._params(request)
        with quiet_logger("chattts_forge.runtime.pipeline", enabled=request.eos_masked):
            start = time.perf_counter()
            chunks = self.pipe.stream([text], params, lookahead_frames=self.stream_lookahead)
            return first_audio_seconds(chunks, lambda chunk: len(chunk[0]) > 0, start)


def decode_step_call(step: Any, hidden_size: int, past: int, batch: int = 1, seed: int = 0) -> Callable[[], object]:
    """One decode step (S = 1) of a plain GPT step object (`session.GptStep`) at a fixed past of
    `past` positions, repeatable: the cache is put back before every call. The values are random
    (seeded): a step's latency does not depend on them."""
    rng = np.random.default_rng(seed)
    step.reset(batch)
    shape = (batch, step.kv_heads, past, step.head_dim)
    cache = [rng.standard_normal(shape, dtype=np.float32) for _ in step.past]
    emb = rng.standard_normal((batch, 1, hidden_size), dtype=np.float32)
    mask = np.ones((batch, past + 1), dtype=np.int64)
    pos = np.full((batch, 1), past, dtype=np.int64)

    def call() -> object:
        step.past = cache
        return step(emb, mask, pos)

    return call
