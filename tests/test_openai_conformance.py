"""Issue 49: the OpenAI speech API, field by field, through the official `openai` client.

`REFERENCE` below is OpenAI's published API reference for `POST /v1/audio/speech` (the OpenAPI
document's `CreateSpeechRequest`, `SpeechAudioDeltaEvent` and `SpeechAudioDoneEvent`), written out
here; the first test holds it against the types of the installed `openai` package (generated from
the same document), so neither can drift unnoticed. Every documented request field and response
format is then sent through the client to a real running server, and what comes back is checked
against the reference: status, content type and bytes of the format, SSE event names and fields,
and the error body's shape. What the server does not implement is listed in docs/serving.md
("OpenAI fields").
"""

from __future__ import annotations

import base64
import io
import json
import typing
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import typing_extensions

openai = pytest.importorskip("openai", reason="the conformance suite needs the openai client (dev extra)")
httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (dev extra)")
pytest.importorskip("starlette", reason="serve needs the serve extra")
pytest.importorskip("uvicorn", reason="serve needs the serve extra")

from test_serve import Running, running  # noqa: E402  (the real uvicorn server in a thread)

from chattts_forge.runtime.chattts_speaker import sample_random_speaker  # noqa: E402
from chattts_forge.runtime.chattts_text import TextTokenizer  # noqa: E402
from chattts_forge.runtime.pipeline import SynthParams  # noqa: E402
from chattts_forge.runtime.serve.formats import content_type  # noqa: E402
from chattts_forge.runtime.textfront import TextFront  # noqa: E402

REFERENCE = {
    "fields": {  # name: (required, JSON type)
        "model": (True, "string"), "input": (True, "string"), "voice": (True, "string | {id}"),
        "instructions": (False, "string"), "response_format": (False, "enum"), "speed": (False, "number"),
        "stream_format": (False, "enum"),
    },
    "input_max_chars": 4096,
    "models": ["tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15"],
    "voices": ["alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
               "marin", "cedar"],
    "response_format": ["mp3", "opus", "aac", "flac", "wav", "pcm"],
    "speed": (0.25, 4.0, 1.0),  # lo, hi, default
    "stream_format": ["sse", "audio"],
    "sse_events": {  # type: required fields and their JSON types
        "speech.audio.delta": {"type": str, "audio": str},
        "speech.audio.done": {"type": str, "usage": dict},
    },
    "usage_fields": ["input_tokens", "output_tokens", "total_tokens"],
    "error_fields": ["message", "type", "param", "code"],
}
FAST = {"max_new_token": 12, "refine": False}  # extensions (extra_body): few code steps, no refinement
TEXT = "Hello there, 2 apples cost $3."
MAGIC = {"mp3": (b"ID3", b"\xff\xfb", b"\xff\xf3", b"\xff\xe3"), "opus": (b"OggS",), "aac": (b"\xff\xf1", b"\xff\xf9"),
         "flac": (b"fLaC",), "wav": (b"RIFF",)}
VOICE_SEEDS = {"alloy": 1, "echo": 2, "fable": 3, "onyx": 4, "nova": 5, "shimmer": 6, "ash": 7, "ballad": 8,
               "coral": 9, "sage": 10, "verse": 11, "marin": 12, "cedar": 13}  # docs/serving.md "Voices": fixed


@pytest.fixture(scope="module")
def server(tiny_artifacts: dict[str, Path]) -> Iterator[Running]:
    with running(tiny_artifacts["fp32"], max_batch=4) as srv:
        yield srv


def literal_values(annotation: object) -> set[str]:
    """Every string of the Literal types inside `annotation` (Unions, Required[...] and aliases opened)."""
    out: set[str] = set()
    for arg in typing.get_args(annotation):
        if isinstance(arg, str):
            out.add(arg)
        else:
            out |= literal_values(arg)
    return out


def test_reference_is_the_installed_clients_api() -> None:
    from openai.types.audio import speech_create_params, speech_model

    hints = typing.get_type_hints(speech_create_params.SpeechCreateParams, include_extras=True)
    assert set(hints) == set(REFERENCE["fields"])
    required = {name for name, hint in hints.items() if typing_extensions.get_origin(hint) is typing_extensions.Required}
    assert required == {name for name, (needed, _) in REFERENCE["fields"].items() if needed}
    assert literal_values(hints["voice"]) == set(REFERENCE["voices"])
    assert literal_values(hints["response_format"]) == set(REFERENCE["response_format"])
    assert literal_values(hints["stream_format"]) == set(REFERENCE["stream_format"])
    assert literal_values(speech_model.SpeechModel) == set(REFERENCE["models"])
    lo, hi, _ = REFERENCE["speed"]  # the speed range is documented in prose only
    assert f"`{lo}` to `{hi}`" in Path(speech_create_params.__file__).read_text(encoding="utf-8")


def speak(server: Running, **fields: typing.Any) -> typing.Any:
    """The client's `audio.speech.create` with the reference's required fields filled and FAST knobs."""
    extra = {**FAST, **fields.pop("extra_body", {})}
    return server.client().audio.speech.create(**{"model": "tts-1", "input": TEXT, "voice": "alloy", **fields},
                                               extra_body=extra)


def test_every_model_name_is_served(server: Running) -> None:
    for model in REFERENCE["models"]:
        r = speak(server, model=model, response_format="wav")
        assert r.response.status_code == 200 and r.response.headers["content-type"] == "audio/wav"


def test_every_voice_is_a_fixed_speaker_and_custom_ids_and_mixes_resolve(server: Running,
                                                                         tiny_artifacts: dict[str, Path]) -> None:
    listed = httpx.get(server.url + "/v1/voices", timeout=30).json()["voices"]
    stats = TextFront.open(tiny_artifacts["fp32"]).speaker_stats
    audio = {}
    for name in REFERENCE["voices"]:
        # the documented seed's speaker: the same on every version of a model with these speaker statistics
        assert listed[name] == sample_random_speaker(stats, np.random.default_rng(VOICE_SEEDS[name])), name
        audio[name] = speak(server, voice=name, response_format="pcm", extra_body={"stream": False}).content
    assert len(set(listed[n] for n in REFERENCE["voices"])) == len(REFERENCE["voices"])  # thirteen speakers
    assert len(set(audio.values())) == len(REFERENCE["voices"])
    assert speak(server, voice={"id": "coral"}, response_format="pcm", extra_body={"stream": False}).content \
        == audio["coral"]  # an OpenAI custom-voice object naming a voice is that voice
    mix = speak(server, voice="alloy(2)+nova(1)", response_format="pcm", extra_body={"stream": False}).content
    assert mix not in (audio["alloy"], audio["nova"])
    again = speak(server, voice="nova(1) + alloy(2)", response_format="pcm", extra_body={"stream": False}).content
    assert again == mix  # a mix is one stable speaker, however its members are ordered
    with pytest.raises(openai.BadRequestError) as bad:
        speak(server, voice={"id": "voice_1234"})
    assert bad.value.body["param"] == "voice" and "unknown voice" in bad.value.body["message"]


def test_voice_mix_is_the_weighted_mean_of_speaker_vectors(tiny_artifacts: dict[str, Path]) -> None:
    from chattts_forge.errors import BadInput
    from chattts_forge.runtime.chattts_speaker import decode_speaker
    from chattts_forge.runtime.serve.voices import VoiceBook

    book = VoiceBook(TextFront.open(tiny_artifacts["fp32"]), {})
    assert book.speaker_for("alloy(1)+alloy(3)") == book.voices["alloy"]  # a voice mixed with itself is itself
    mixed = decode_speaker(book.speaker_for("alloy(3)+echo(1)")).astype(np.float32)
    want = (0.75 * decode_speaker(book.voices["alloy"]).astype(np.float32)
            + 0.25 * decode_speaker(book.voices["echo"]).astype(np.float32)).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(mixed, want)
    assert book.speaker_for("alloy+echo") == book.speaker_for("echo(2)+alloy(2)")
    for bad in ("alloy(0)+echo", "alloy(-1)+echo", "alloy+", "alloy(2", "default+alloy", "alloy+nobody",
                "+".join(["alloy"] * 9)):
        with pytest.raises(BadInput) as e:
            book.speaker_for(bad)
        assert e.value.param == "voice", bad


def test_every_response_format_whole_and_streamed(server: Running) -> None:
    for fmt in REFERENCE["response_format"]:
        for stream in (False, True):
            r = speak(server, response_format=fmt, extra_body={"stream": stream})
            assert r.response.status_code == 200
            assert r.response.headers["content-type"] == content_type(fmt), (fmt, stream)
            data = r.content
            if fmt == "pcm":
                assert len(data) % 2 == 0 and len(data) > 0
            else:
                assert data.startswith(MAGIC[fmt]), (fmt, stream, data[:4])
    with server.client().audio.speech.with_streaming_response.create(
            model="tts-1", input=TEXT, voice="alloy", response_format="wav", extra_body=FAST) as r:
        data = b"".join(r.iter_bytes())
    assert r.headers["content-type"] == "audio/wav" and data.startswith(b"RIFF")
    assert speak(server).response.headers["content-type"] == content_type("mp3")  # mp3 is the default


def test_instructions_are_accepted(server: Running) -> None:
    plain = speak(server, response_format="pcm", extra_body={"stream": False}).content
    told = speak(server, response_format="pcm", instructions="Speak in a cheerful tone.",
                 extra_body={"stream": False}).content
    assert told == plain  # accepted and documented as unused: ChatTTS follows no style instructions


def test_input_bound_and_error_shape(server: Running) -> None:
    ok = speak(server, input="Hi. " * (REFERENCE["input_max_chars"] // 4), response_format="pcm",
               extra_body={"max_new_token": 2})
    assert ok.response.status_code == 200
    with pytest.raises(openai.BadRequestError) as e:
        speak(server, input="a" * (REFERENCE["input_max_chars"] + 1))
    body = e.value.body
    assert set(REFERENCE["error_fields"]) <= set(body) and body["param"] == "input"
    assert body["type"] == "invalid_request_error" and isinstance(body["message"], str)
    for fields, param in (({"voice": "nobody"}, "voice"), ({"model": "gpt-5-tts"}, "model"),
                          ({"response_format": "ogg"}, "response_format"), ({"speed": 5.0}, "speed"),
                          ({"stream_format": "ws"}, "stream_format"), ({"input": "   "}, "input")):
        with pytest.raises(openai.BadRequestError) as e:
            speak(server, **fields)
        assert e.value.body["param"] == param, (fields, e.value.body)


def sse_events(server: Running, fmt: str, extra: dict[str, typing.Any]) -> list[dict[str, typing.Any]]:
    body = {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": fmt, "stream_format": "sse",
            **FAST, **extra}
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines[:3]
    return [json.loads(line[len("data: "):]) for line in lines]


def test_sse_events_have_the_reference_shape_and_usage_counts_tokens(server: Running,
                                                                     tiny_artifacts: dict[str, Path]) -> None:
    steps = 10
    front = TextFront.open(tiny_artifacts["fp32"])
    spoken, _ = front.segments(TEXT, SynthParams())
    tokens = len(TextTokenizer(tiny_artifacts["fp32"] / "tokenizer.json").ids(spoken[0]))
    for stream in (True, False):
        for fmt in ("pcm", "mp3"):
            events = sse_events(server, fmt, {"stream": stream, "max_new_token": steps, "min_new_token": steps})
            types = [e["type"] for e in events]
            assert types[-1] == "speech.audio.done" and set(types[:-1]) == {"speech.audio.delta"}
            for e in events:
                for name, kind in REFERENCE["sse_events"][e["type"]].items():
                    assert isinstance(e[name], kind), (e["type"], name)
            audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
            if fmt == "mp3":
                assert audio.startswith(MAGIC["mp3"])
            usage = events[-1]["usage"]
            assert sorted(usage) == sorted(REFERENCE["usage_fields"])
            assert usage["output_tokens"] == steps  # audio tokens: the code steps generated
            assert usage["input_tokens"] == tokens  # text tokens of the input as spoken
            assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_wav_reply_is_what_the_reference_names(server: Running) -> None:
    data = speak(server, response_format="wav", extra_body={"stream": False}).content
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() > 0


def test_speed_scales_the_duration_over_the_reference_range(server: Running) -> None:
    lo, hi, default = REFERENCE["speed"]
    steps = {"max_new_token": 40, "min_new_token": 40}
    for stream in (False, True):
        base = len(speak(server, response_format="pcm", extra_body={"stream": stream, **steps}).content) // 2
        assert len(speak(server, response_format="pcm", speed=default,
                         extra_body={"stream": stream, **steps}).content) // 2 == base
        for speed in (lo, 0.5, 2.0, hi):
            got = len(speak(server, response_format="pcm", speed=speed,
                            extra_body={"stream": stream, **steps}).content) // 2
            assert abs(got / (base / speed) - 1) <= 0.03, (stream, speed, got, base)
