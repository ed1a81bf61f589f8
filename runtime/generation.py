"""The generation loop: ChatTTS's `GPT.generate` with a KV cache, one `StepState` per step.

Batching: all texts of one call share every GPT step (left padding, as ChatTTS). A row stops when
any of its num_vq streams emits EOS; the loop ends when every row has stopped or after
`max_new_token` steps. `Pipeline.iter_generate` runs it on the pipeline's GPT engine, embedding
and heads; the serving scheduler (runtime.scheduler) batches requests step by step with the same
processing and sampling.

GPT engines: `plain` runs gpt.onnx (GptStep); `fast` the fused gpt_fast.onnx with an in-place KV
cache (runtime.fast_gpt, graph built by quantize.fast_gpt_graph); `auto` takes fast when the artifact
has it. The default is `auto`, as for `synth`: a service (and the evaluate gate) runs the fast graph
when it exists. On CUDA `auto` takes the plain graph with the cache kept on the device
(runtime.device_gpt): the fused graph's GroupQueryAttention has no float32 CUDA kernel.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from chattts_forge.artifact import FAST_GPT, GPT, HEAD_CODE, HEAD_TEXT
from chattts_forge.choices import Choice
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger
from chattts_forge.runtime.fast_gpt import FastGptStep
from chattts_forge.runtime.gpt_step import GptStep, GptStepLike
from chattts_forge.runtime.loaded_artifact import LoadedArtifact
from chattts_forge.runtime.sampling import Sampler, SamplingConfig, SeedGroups, process_logits

if TYPE_CHECKING:
    from chattts_forge.runtime.pipeline import Pipeline

# The pipeline's logger: callers that expect rows to hit max_new_token (warm, benchmarks) quiet it by name.
log = get_logger("chattts_forge.runtime.pipeline")



class GptEngine(Choice):
    """Which GPT step the runtime runs: fast (gpt_fast.onnx, in-place KV cache), plain (gpt.onnx), auto
    (fast when the artifact has it and runs on the CPU)."""

    AUTO = "auto"
    FAST = "fast"
    PLAIN = "plain"


ENGINES = GptEngine.values()


class PromptBatch(NamedTuple):
    """The embedded prompts of one generation (left-padded): what the loop's prefill takes."""

    inputs_embeds: np.ndarray  # float32 [B, L, hidden]
    input_ids: np.ndarray  # int64 [B, L, num_vq]
    attention_mask: np.ndarray  # [B, L]


@dataclass
class StepState:
    """The state of a generation loop after a step (arrays are shared; copy what you keep)."""

    tokens: np.ndarray  # int64 [B, max_new_token, streams]
    hiddens: np.ndarray  # float32 [B, max_new_token, hidden]
    end_idx: np.ndarray  # int64 [B]: kept steps per row (EOS step excluded)
    finish: np.ndarray  # bool [B]
    infer_text: bool
    record_logits: bool
    forced_lengths: list[int] | None = None
    logits: list[np.ndarray] = field(default_factory=list)  # per step [B, streams, V]
    steps: int = 0
    done: bool = False  # True on the last step (all rows stopped or max_new_token reached)

    def result(self) -> Generation:
        batch = self.tokens.shape[0]
        ends = self.end_idx
        ids = [
            self.tokens[b, : ends[b], 0].copy() if self.infer_text else self.tokens[b, : ends[b]].copy()
            for b in range(batch)
        ]
        rec = None
        if self.record_logits and self.logits:
            stacked = np.stack(self.logits, 1)  # [B, steps, streams, V]
            if self.forced_lengths is not None:
                rec = [stacked[b, : self.forced_lengths[b]] for b in range(batch)]
            else:  # every decision of the row, the EOS decision included
                rec = [stacked[b, : ends[b] + (1 if self.finish[b] else 0)] for b in range(batch)]
        return Generation(
            ids=ids,
            hiddens=[self.hiddens[b, : ends[b]].copy() for b in range(batch)],
            processed_logits=rec,
            finished=self.finish.copy(),
        )


@dataclass
class Generation:
    """Raw output of one generation loop over a batch."""

    ids: list[np.ndarray]  # per row: codes [T, num_vq] or text ids [T]
    hiddens: list[np.ndarray]  # per row: [T, hidden]
    processed_logits: list[np.ndarray] | None = None  # per row: [T, streams, V] when recorded
    finished: np.ndarray | None = None  # per row: stopped on EOS (False: hit max_new_token)


def check_engine(engine: str) -> None:
    """ForgeError unless `engine` is one of ENGINES."""
    if engine not in ENGINES:
        raise BadInput(f"unknown GPT engine '{engine}' (choose from: {', '.join(ENGINES)})")


def choose_engine(artifact: LoadedArtifact, engine: str = "auto") -> str:
    """The GPT engine ("fast" or "plain") the runtime runs for `engine` (one of ENGINES) on `artifact`."""
    check_engine(engine)
    if engine == "fast" and not artifact.has_component(FAST_GPT):
        raise ForgeError(f"artifact {artifact.path} has no {FAST_GPT} component (engine 'fast')")
    if engine == "fast":
        return "fast"
    on_cpu = artifact.provider == "cpu"
    return "fast" if engine == "auto" and on_cpu and artifact.has_component(FAST_GPT) else "plain"


def open_gpt_step(artifact: LoadedArtifact, engine: str = "auto") -> GptStepLike:
    """A new GPT step (its own KV cache) of `artifact` for `engine` (see `choose_engine`)."""
    if choose_engine(artifact, engine) == "fast":
        return FastGptStep.from_artifact(artifact)
    if artifact.provider == "cuda":
        # device_gpt: CUDA only, never loaded on a CPU run
        from chattts_forge.runtime.device_gpt import DeviceGptStep

        return DeviceGptStep(artifact.session(GPT), artifact.dims, device="cuda")
    return GptStep(artifact.session(GPT), artifact.dims)


def position_ids(attention_mask: np.ndarray) -> np.ndarray:
    """ChatTTS: cumsum(attention_mask) - 1, masked positions set to 1."""
    pos = np.cumsum(attention_mask, axis=1) - 1
    pos[attention_mask == 0] = 1
    return pos.astype(np.int64)


def iter_generate(
    pipe: Pipeline,
    prompt: PromptBatch,
    cfg: SamplingConfig,
    *,
    infer_text: bool,
    max_new_token: int,
    seed: int | SeedGroups | None,
    ensure_non_empty: bool = True,
    forced: Sequence[np.ndarray] | None = None,
) -> Iterator[StepState]:
    """ChatTTS's `GPT.generate` on `pipe`'s GPT engine, embedding and heads, one `StepState` per step.

    Steps until every row emitted EOS (any of its streams) or `max_new_token`. `forced` (teacher
    forcing, codes only): per row int [T, num_vq]; each step takes the given tokens (EOS after a
    row's end) instead of samples, and the processed logits are recorded. `seed`: one seed for every
    row, or `SeedGroups` (groups of rows sampled as separate batches would be).
    """
    batch = prompt.input_ids.shape[0]
    streams = 1 if infer_text else pipe.num_vq
    head = pipe.artifact.session(HEAD_TEXT if infer_text else HEAD_CODE)
    head_out = head.get_outputs()[0].name
    sampler = Sampler(cfg, streams, batch, seed)
    state = StepState(
        tokens=np.zeros((batch, max_new_token, streams), dtype=np.int64),
        hiddens=np.zeros((batch, max_new_token, pipe.dims.hidden_size), dtype=np.float32),
        end_idx=np.zeros(batch, dtype=np.int64),
        finish=np.zeros(batch, dtype=bool),
        infer_text=infer_text,
        record_logits=forced is not None,
        forced_lengths=None if forced is None else [len(f) for f in forced],
    )
    gpt = pipe.gpt
    mask = prompt.attention_mask.astype(np.int64)
    reserve = getattr(gpt, "reserve", None)  # engines with a preallocated cache (FastGptStep)
    if reserve is not None:  # size the cache by the request, not by the model's positions
        reserve(mask.shape[1] + max_new_token)
    gpt.reset(batch)
    hidden = gpt(prompt.inputs_embeds, mask, position_ids(mask))[:, -1]
    for step in range(max_new_token):
        if step > 0:
            new_ids = state.tokens[:, step - 1 : step, :]
            if infer_text:
                new_ids = np.repeat(new_ids, pipe.num_vq, axis=2)
            step_emb = pipe.embed(new_ids, np.full((batch, 1), infer_text, dtype=bool))
            mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
            hidden = gpt(step_emb, mask, mask.sum(axis=1, keepdims=True) - 1)[:, -1]
        state.hiddens[:, step] = hidden
        logits = head.run([head_out], {"hidden_states": hidden})[0].reshape(batch * streams, -1)
        # rows (b, stream), columns: the tokens generated so far
        history = state.tokens[:, :step, :].transpose(0, 2, 1).reshape(batch * streams, step)
        scores = process_logits(logits, history, step, cfg, streams)
        if state.record_logits:
            state.logits.append(scores.reshape(batch, streams, -1))
        if forced is not None:
            eos_row = np.full(streams, cfg.eos_token, dtype=np.int64)
            idx = np.stack([f[step] if step < len(f) else eos_row for f in forced])
        else:
            idx = sampler.next_tokens(scores, redraw_ended=step == 0 and ensure_non_empty)
        state.tokens[:, step] = idx
        state.finish |= (idx == cfg.eos_token).any(axis=1)
        state.end_idx += ~state.finish
        state.steps = step + 1
        state.done = bool(state.finish.all()) or step + 1 == max_new_token
        yield state
        if state.finish.all():
            break
    if not state.finish.all():
        log.warning(
            "incomplete result: %d of %d rows hit max_new_token %d",
            int((~state.finish).sum()), batch, max_new_token,
        )


def last_state(it: Iterator[StepState]) -> StepState:
    """The final state of a generation loop (it holds the result)."""
    state = None
    for state in it:  # noqa: B007 - the last state holds the result
        pass
    if state is None:
        raise RuntimeError("generation produced no step")
    return state
