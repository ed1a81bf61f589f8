"""ChatTTS's generation defaults, written once: the values of ChatTTS 0.2.5's `Chat.InferCodeParams`
and `Chat.RefineTextParams`.

Every place that offers these knobs takes its defaults from here: the runtime's parameter types
(`runtime.pipeline.InferCodeParams`/`RefineTextParams`, `runtime.sampling.SamplingConfig`), the
command line (`cli_options.sampling_options`, `synth`/`warm`/`reference` --max-new-token and
--prompt), `SynthConfig` and `WarmConfig`, torch_ref's `ReferenceParams` and `OracleParams`, and the
drop-in API (`runtime.compat`, which keeps ChatTTS's own names). The parity checks rely on all of
them being equal to ChatTTS's.
"""

from __future__ import annotations

# ---- code generation (Chat.InferCodeParams) ---------------------------------------------------
CODE_PROMPT = "[speed_5]"  # the speed/oral/laugh/break tags the codes are generated under
CODE_TEMPERATURE = 0.3
CODE_REPETITION_PENALTY = 1.05
CODE_MAX_NEW_TOKEN = 2048  # most code steps per text
STREAM_BATCH = 24  # code steps between streamed chunks

# ---- text refinement (Chat.RefineTextParams) --------------------------------------------------
REFINE_PROMPT = ""
REFINE_TEMPERATURE = 0.7
REFINE_REPETITION_PENALTY = 1.0
REFINE_MAX_NEW_TOKEN = 384

# ---- shared by both -----------------------------------------------------------------------------
TOP_P = 0.7
TOP_K = 20
MIN_NEW_TOKEN = 0
