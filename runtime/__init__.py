"""The runtime: ChatTTS inference on an ONNX artifact folder with onnxruntime + numpy, no torch.

Only onnxruntime, numpy, tokenizers, soundfile and pybase16384 are used; importing or running
this package never imports torch or the chattts package (tests/test_runtime_torchfree.py).

Library use::

    from chattts_forge.runtime import Pipeline, SynthParams, InferCodeParams, RefineTextParams

    pipe = Pipeline("build/artifacts/fp32", provider="cpu", threads=2)
    params = SynthParams(code=InferCodeParams(temperature=0.3, seed=7))   # ChatTTS defaults
    [res] = pipe.synthesize(["你好，欢迎使用。"], params)
    res.wav        # float32 [samples], 24 kHz mono
    res.codes      # int64 [steps, num_vq]
    res.hiddens    # float32 [steps, hidden] (what the Decoder got)
    write_wav("out.wav", res.wav, pipe.sample_rate)          # atomic, float32 WAV

    for chunk in pipe.stream(["text one", "text two"], params):   # every 24 steps
        ...                                                       # chunk[i]: new samples of text i
    # pipe.stream(..., on_done=fn) calls fn(Generation) with the codes/hiddens at the end

Parameters (dataclasses, ChatTTS names/defaults): `InferCodeParams` (prompt "[speed_5]", spk_emb,
spk_smp/txt_smp, temperature 0.3 (or one per code stream), top_p 0.7, top_k 20,
repetition_penalty 1.05, max_new_token 2048, min_new_token 0, stream_batch 24, ensure_non_empty,
seed), `RefineTextParams` (prompt "", temperature 0.7, top_p 0.7, top_k 20, repetition_penalty 1.0,
max_new_token 384, ...), `SynthParams(code, refine=None (no refinement), use_decoder=True,
normalize=True, homophones=True, lang=None, split_sentences=False)`.

Pieces for parity tests (all on a `Pipeline`):

- `pipe.normalize(text)`: ChatTTS's Normalizer (zh/en detection, homophones, character maps,
  invalid characters filtered with a warning). ForgeError for empty / unspeakable text.
- `pipe.infer_code(normalised_texts, InferCodeParams) -> Generation`: ChatTTS's `_infer_code`
  (no normalisation); `.ids[b]` int64 [steps, num_vq], `.hiddens[b]` float32 [steps, hidden],
  `.finished[b]` stopped on EOS.
- `pipe.teacher_forced_logits(normalised_texts, codes, InferCodeParams) -> list[np.ndarray]`:
  per text float32 [T_b, num_vq, num_audio_tokens], the processed logits (temperature, repetition
  penalty, top-p, top-k, min_new_token EOS mask; -inf where filtered) at step i when fed
  `codes[b][:i]` (int [T_b, num_vq]) - the array ChatTTS's softmax sees.
- `pipe.decode(items, use_decoder=True) -> list[wav]`: hidden states [T, hidden] (Decoder) or
  codes [T, num_vq] (DVAE) -> waveform float32 [hop * (2T - 1)], each item alone.
  `pipe.decode_to_wavs(items, use_decoder)`: ChatTTS's `_decode_to_wavs` batch semantics
  (zero-padded to the longest item, [items, hop * (2 T_max - 1)]).
- `pipe.prepare_code_inputs(texts, params)`: (inputs_embeds, input_ids, attention_mask) of
  the code stage, speaker injected.
- `pipe.random_speaker(seed)`: a speaker string from the artifact's speaker statistics.
- `chattts_forge.runtime.sampling`: `process_logits`, `apply_top_p`, `apply_top_k`,
  `apply_repetition_penalty` (numpy ports of ChatTTS's processors and transformers' warpers).
- `chattts_forge.runtime.chattts_text` (ChatTTS's text front end, ported): `Normalizer`, `TextTokenizer`,
  `split_sentences`, `decorate_code_prompts`, `decorate_text_prompts`; `chattts_forge.runtime.chattts_speaker`
  (ChatTTS's speakers, ported): the speaker (`spk_emb`) and speaker sample (`spk_smp`) strings.
  `chattts_forge.runtime.textfront.TextFront` is a variant's front end without a model session.
- `chattts_forge.runtime.synth`: `SynthConfig` -> `synthesize_to_files`, `WarmConfig` -> `warm_phrase_cache`
  (the library of `chattts-forge synth` and `warm`, which map their options onto those configs).
- `chattts_forge.runtime.timing`: RTF / streams / first audio / peak RSS definitions and statistics
  (bench, evaluate, quantize; docs/bench.md "Definitions"); `runtime.timed_engine.OnnxEngine` the
  runtime timed (the PyTorch baseline: `chattts_forge.torch_ref.engine.TorchEngine`);
  `runtime.memory_probe` peak RSS per phase and of a fresh process; `runtime.machine` machine info.

Decisions and errors (each a one-line `ForgeError`; the CLI prints `error: ...`, exit 2):
- empty text; text that normalises to nothing speakable (only punctuation/spaces left);
- unknown characters are filtered out with a warning, exactly as ChatTTS's Normalizer does
  (after mapping `!:;()<>-` and full-width brackets to `,`/`.`), not an error;
- overlong input: prompt tokens + max_new_token beyond the model's positions (4096) is an error;
  `SynthParams(split_sentences=True)` / `synth --split-sentences` splits like `Chat.infer` and
  joins the audio of the sentences (generated as one batch);
- missing artifact files, artifact.json schema/size/sha256 mismatches (every file checked against
  its recorded sha256 before the first session, then vouched for by the verified-hash cache;
  `Pipeline(..., verify="size")` opts out; docs/signing.md), a published folder whose model.sig does
  not verify with `Pipeline(..., public_key=KEY)`, unknown or unavailable provider.
- ChatTTS details kept on purpose: top_k/top_p keep at least 3 tokens; the repetition penalty's
  row-zeroing beyond `max_input_ids` rows; EOS in any stream ends the row; the EOS step is not
  part of the codes. Not reproduced: torch's RNG stream; the speaker-from-audio step ChatTTS runs
  when it splits a text into several sentences is done by `chattts_forge.compat` (not by
  `SynthParams(split_sentences=True)`).
- Voice cloning: `pipe.sample_audio_speaker(wav)` (a 1-D float 24 kHz recording -> the `spk_smp`
  string ChatTTS makes of it, through the artifact's `dvae_encoder.onnx`), `pipe.encode_audio(wav)`
  (its codes [num_vq, T]); `InferCodeParams(spk_smp=..., txt_smp=...)` uses it.

ChatTTS's own API (`Chat`, `Chat.InferCodeParams`, `infer`, ...) on an artifact:
`chattts_forge.runtime.compat`, also importable as `chattts_forge.compat`.

GPT engine: `Pipeline(..., engine="auto")` (default: fast when the artifact has gpt_fast.onnx, as
`synth --engine auto`), "fast" (gpt_fast.onnx through `fast_gpt.FastGptStep`, in-place KV cache)
or "plain" (gpt.onnx through `gpt_step.GptStep`). `choose_engine(artifact, engine)` is that choice
(what `pipe.engine` holds), `open_gpt_step(artifact, engine)` a new step of it.

Hooks for the stages built on the runtime (they need none of its private names):
- a replaceable GPT step: `pipe.gpt` is a `GptStepLike` (reset(batch), past_length,
  __call__(inputs_embeds, attention_mask, position_ids) -> last_hidden_state); assign any object
  with that interface (bench times it, fidelity replays recorded steps through it);
- an observer of graph inputs: `pipe.artifact.add_observer(fn, components)` calls
  `fn(component, feeds, output_names, outputs)` after every session `run` (calibration records
  with it); it returns a function that removes the observer.

The fused GPT graph itself is built outside the runtime, by `chattts_forge.quantize.fast_gpt_graph`
(torch-free; convert and quantize both call it); the runtime only loads and runs it. Its KV cache is float32 or int8 (`quantize --kv-cache int8`); the
pipeline sizes it by the request (`FastGptStep.reserve(prompt + max_new_token)`), and
`runtime.memory` computes the memory a request batch needs from the dimensions.

Serving: `runtime.scheduler.Scheduler(pipe, max_batch=8, max_queue=64)` batches requests
continuously (they join the running GPT batch between steps and leave when they end; each
request's codes equal its codes alone), streams audio per request (`handle.chunks()`,
`async for chunk in handle`), cancels (`handle.cancel()` frees the row) and refuses when its
bounded queue is full; `decode_worker=True` (default: when the intra-op threads leave a core free)
runs Decoder + Vocos on a worker thread that overlaps the next GPT steps.

Serving a published version (docs/serving.md):
- `router.Router(version_dir, variant=None, cache=None, autotune=None, **pipeline_kwargs)`: each text
  goes to its length bucket's variant: the fastest on this host of those the gate passed there,
  ranked at first load by a bounded, cached self-benchmark (`autotune`; docs/autotune.md), or the
  build's choice with `autotune=False`. Texts are normalised and measured by a session-free front
  end (`router.front`, `textfront.TextFront`); a variant opens on its first text and one no bucket
  routes to (FP32 included) is never opened;
- saved sessions (`saved_sessions`): the first CPU session of a published variant's graph saves onnxruntime's optimized
  graph with its prepacked weights under the user cache; later processes load it (no packing, the
  same outputs, weight pages shared between processes). `CHATTTS_FORGE_SAVED_SESSIONS=0` turns it off;
- a warm phrase cache: `Pipeline(..., cache=PATH)` (or a `phrase_cache.PhraseCache`); a cached text
  skips the code stage and the Decoder (`Result.cached`), same waveform; other knobs, another
  artifact or a tampered file are refused. `phrase_cache_build.build_phrase_cache` builds one (`warm`).

Command line: `chattts-forge synth --artifact DIR --text T --out WAV` (see `runtime/cli.py`), and
`chattts-forge warm --artifact DIR --phrases FILE --out CACHE`.
"""

from chattts_forge.runtime.audio import write_wav
from chattts_forge.runtime.generation import ENGINES, Generation, check_engine, choose_engine, open_gpt_step
from chattts_forge.runtime.gpt_step import GptStep, GptStepLike
from chattts_forge.runtime.loaded_artifact import LoadedArtifact, RunObserver
from chattts_forge.runtime.params import InferCodeParams, RefineTextParams, SynthParams
from chattts_forge.runtime.pipeline import Pipeline, Result
from chattts_forge.runtime.stream_decode import StreamDecoder

__all__ = [
    "ENGINES",
    "LoadedArtifact",
    "Generation",
    "GptStep",
    "GptStepLike",
    "InferCodeParams",
    "Pipeline",
    "RefineTextParams",
    "Result",
    "RunObserver",
    "StreamDecoder",
    "SynthParams",
    "check_engine",
    "choose_engine",
    "open_gpt_step",
    "write_wav",
]
