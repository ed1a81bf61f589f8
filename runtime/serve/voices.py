"""The server's voices: OpenAI's names, the voices file's, raw speaker strings and weighted mixes.

- OpenAI's thirteen built-in names map to fixed speakers: `TextFront.random_speaker(seed)` with the
  name's seed below, drawn from the artifact's speaker statistics (what `synth --speaker random --seed
  SEED` uses). numpy's PCG64 stream is stable, so a name means the same voice on every version of a
  model whose speaker statistics are the same, and existing client code runs unchanged.
- `default` is the model's own voice (no speaker string).
- A voices file (`serve --voices FILE`, JSON {name: speaker string}) adds the project's own speakers;
  an OpenAI custom voice `{"id": NAME}` names one of them (or any name above).
- A raw ChatTTS speaker string is used as it is.
- A weighted mix `"alloy(2)+nova(1)"` (Kokoro-FastAPI's syntax; a weight left out is 1) is the
  weighted mean of its members' speaker vectors, encoded as a speaker string: the same mix is always
  the same speaker (and so shares phrase-cache entries), in whatever order its members are written.
  `default` has no vector and cannot be mixed.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np

from chattts_forge.errors import BadInput, ForgeError, NotFound, quote
from chattts_forge.runtime.chattts_speaker import decode_speaker, encode_speaker, speaker_vector
from chattts_forge.runtime.textfront import TextFront

# Seeds are fixed forever: the first six kept theirs when the later seven were added.
OPENAI_VOICE_SEEDS = {"alloy": 1, "echo": 2, "fable": 3, "onyx": 4, "nova": 5, "shimmer": 6, "ash": 7,
                      "ballad": 8, "coral": 9, "sage": 10, "verse": 11, "marin": 12, "cedar": 13}
DEFAULT_VOICE = "default"  # no speaker string: the model's own default voice (what `warm` uses by default)
MAX_MIX_MEMBERS = 8
_MIX_MEMBER = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\(\s*([0-9]*\.?[0-9]+)\s*\))?\s*$")


def load_voices(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """A voices file: JSON {name: speaker string}; names must not shadow OpenAI's or 'default'."""
    if path is None:
        return {}
    p = Path(path)
    try:
        table = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFound(f"voices file {p} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"voices file {p} is not valid JSON ({e})") from None
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
        raise BadInput(f"voices file {p} must hold one JSON object of name -> speaker string")
    return {k.strip(): v.strip() for k, v in table.items()}


def parse_mix(voice: str) -> list[tuple[str, float]] | None:
    """[(name, weight), ...] of a mix such as "alloy(2)+nova(1)" (or "alloy+nova"); None when `voice`
    is not written as a mix (no "+" and no weight); BadInput when it is one written wrong."""
    if "+" not in voice and "(" not in voice:
        return None
    members = []
    for part in voice.split("+"):
        m = _MIX_MEMBER.match(part)
        if m is None:
            raise BadInput(f"voice mix {quote(voice)}: {quote(part.strip())} is not NAME or NAME(WEIGHT)", "voice")
        weight = float(m.group(2)) if m.group(2) is not None else 1.0
        if not math.isfinite(weight) or weight <= 0:
            raise BadInput(f"voice mix {quote(voice)}: the weight of {m.group(1)} must be > 0", "voice")
        members.append((m.group(1), weight))
    if len(members) > MAX_MIX_MEMBERS:
        raise BadInput(f"voice mix {quote(voice)} has {len(members)} voices; at most {MAX_MIX_MEMBERS}", "voice")
    return members


class VoiceBook:
    """The voices one served version answers to (see the module docstring)."""

    def __init__(self, front: TextFront, named: dict[str, str]) -> None:
        self.hidden_size = front.dims.hidden_size
        self.voices: dict[str, str | None] = {DEFAULT_VOICE: None}
        for name, seed in OPENAI_VOICE_SEEDS.items():
            self.voices[name] = front.random_speaker(seed)
        for name, spk in named.items():
            if name in self.voices:
                raise BadInput(f"voices file: name {name!r} is reserved (OpenAI's voices and 'default')")
            if parse_mix(name) is not None:
                raise BadInput(f"voices file: name {name!r} holds '+' or '(' (they write a voice mix)")
            try:
                speaker_vector(spk, self.hidden_size)
            except ForgeError as e:
                raise BadInput(f"voices file: voice {name!r}: {e}") from None
            self.voices[name] = spk

    def speaker_for(self, voice: str) -> str | None:
        """The speaker string of a voice name, a mix, or `voice` itself when it is a raw speaker string;
        BadInput naming the field `voice` otherwise."""
        if voice in self.voices:
            return self.voices[voice]
        if len(voice) > 64:  # a raw spk_emb string (ChatTTS's speaker strings are hundreds of characters)
            try:
                speaker_vector(voice, self.hidden_size)
            except ForgeError as e:
                raise BadInput(f"voice is neither a known name nor a valid speaker string ({e})", "voice") from None
            return voice
        members = parse_mix(voice)
        if members is None:
            raise BadInput(f"unknown voice {quote(voice)} (voices: {', '.join(sorted(self.voices))}; a mix such "
                           "as alloy(2)+nova(1); or a raw speaker string)", "voice")
        return self.mix(members)

    def mix(self, members: list[tuple[str, float]]) -> str:
        """The speaker string of the weighted mean of `members`' speaker vectors (float32, then the
        float16 a speaker string holds)."""
        total = np.zeros(self.hidden_size, dtype=np.float32)
        weights: dict[str, float] = {}
        for name, weight in members:
            weights[name] = weights.get(name, 0.0) + weight
        whole = sum(weights.values())
        for name, weight in sorted(weights.items()):  # one summation order: the mix, not its spelling
            if name not in self.voices:
                raise BadInput(f"voice mix: unknown voice {quote(name)} (voices: "
                               f"{', '.join(sorted(n for n in self.voices if n != DEFAULT_VOICE))})", "voice")
            spk = self.voices[name]
            if spk is None:
                raise BadInput(f"voice mix: {name!r} is the model's own voice, which has no speaker vector to mix",
                               "voice")
            total += np.float32(weight / whole) * decode_speaker(spk).astype(np.float32)
        return encode_speaker(total)
