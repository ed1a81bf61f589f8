"""ChatTTS's generation defaults, written once: the values of ChatTTS 0.2.5's `Chat.InferCodeParams`
and `Chat.RefineTextParams`.

Every place that offers these knobs takes its defaults from here: the runtime's parameter types
(`runtime.pipeline.InferCodeParams`/`RefineTextParams`, `runtime.sampling.SamplingConfig`), the
command line (`CodeKnobs`' declared options, `synth`/`warm`/`reference` --max-new-token and
--prompt), `SynthConfig` and `WarmConfig`, torch_ref's `ReferenceParams` and `OracleParams`, and the
drop-in API (`runtime.compat`, which keeps ChatTTS's own names). The parity checks rely on all of
them being equal to ChatTTS's. `CodeKnobs` is the one dataclass of the code knobs that the
command-line configs inherit.
"""

from __future__ import annotations

from dataclasses import dataclass

from chattts_forge.errors import BadInput
from chattts_forge.options import option

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


@dataclass(frozen=True, kw_only=True)
class CodeKnobs:
    """ChatTTS's code-generation knobs under the command line's names, with InferCodeParams'
    defaults: the base of `runtime.synth.SynthConfig`/`WarmConfig` and torch_ref's `ReferenceParams`
    (the drop-in API, `runtime.compat`, keeps ChatTTS's own names and defines its own). Keyword-only,
    so a subclass's own fields keep their positions."""

    # declared as the sampling options of `synth`, `warm` and `reference` (each command spells its own
    # --max-new-token and --prompt)
    temperature: float = option(CODE_TEMPERATURE, "--temperature", "Code sampling temperature.", kind=float,
                                show_default=True)
    top_p: float = option(TOP_P, "--top-p", "Top-p (keeps >= 3 tokens).", kind=float, show_default=True)
    top_k: int = option(TOP_K, "--top-k", "Top-k (keeps >= 3 tokens).", kind=int, show_default=True)
    repetition_penalty: float = option(CODE_REPETITION_PENALTY, "--repetition-penalty", "ChatTTS's windowed penalty.",
                                       kind=float, show_default=True)
    min_new_token: int = option(MIN_NEW_TOKEN, "--min-new-token", "EOS is masked before this.", kind=int,
                                show_default=True)
    max_new_token: int = CODE_MAX_NEW_TOKEN
    prompt: str = CODE_PROMPT

    def check_knobs(self) -> None:
        """BadInput naming the option of the first knob out of range."""
        if not self.temperature > 0:
            raise BadInput("--temperature must be > 0")
        if not 0 < self.top_p <= 1:
            raise BadInput("--top-p must lie in (0, 1]")
        if self.top_k < 1:
            raise BadInput("--top-k must be >= 1")
        if not self.repetition_penalty > 0:
            raise BadInput("--repetition-penalty must be > 0")
        if self.max_new_token < 1:
            raise BadInput("--max-new-token must be >= 1")
        if not 0 <= self.min_new_token <= self.max_new_token:
            raise BadInput("--min-new-token must lie between 0 and --max-new-token")
