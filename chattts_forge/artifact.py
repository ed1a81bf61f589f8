"""The artifact contract: file names, components, variants, `artifact.json` as a typed object.

Every stage that reads or writes an artifact folder (docs/artifact-format.md) goes through this
module, so the layout is defined once. It belongs to the core: it imports nothing above
`chattts_forge` itself (no runtime, convert, quantize; no torch, no onnx). Whether files match
their records (hashing, checking, the verified-hash cache) is `chattts_forge.integrity`; writing a
component's graph is `chattts_forge.graph_storage.write_component`.

Library::

    from chattts_forge.artifact import ArtifactMeta
    meta = ArtifactMeta.load("build/convert/fp32")    # validated; one-line ForgeError when broken
    meta.variant, meta.components["gpt"]["precision"], meta.component_file(folder, "gpt")
    meta.variant = "int4"; meta.write(folder)          # atomic; unchanged keys keep their bytes
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from chattts_forge.checkpoint.layout import Dims
from chattts_forge.choices import Choice
from chattts_forge.errors import BadInput, ForgeError, NotFound
from chattts_forge.fsutil import atomic_write_json, resolve_inside

# ---- file names ------------------------------------------------------------------------------

ARTIFACT_JSON = "artifact.json"
SCHEMA = "chattts-forge/artifact/1"
# The component names (each graph's name in artifact.json, and its file `<name>.onnx` unless its entry
# names another file): the one place they are spelled.
EMBED = "embed"  # text token and code embeddings
GPT = "gpt"  # the Llama-style GPT, one step with its KV cache (plain graph; the fused one is FAST_GPT)
HEAD_CODE = "head_code"  # GPT hidden states -> logits of the 4 audio-code streams
HEAD_TEXT = "head_text"  # GPT hidden states -> text logits (text refinement)
DECODER = "decoder"  # GPT hidden states -> mel (ChatTTS's Decoder); quantized variants: weight-only INT8
DVAE = "dvae"  # codes -> mel (ChatTTS's DVAE decode path, `--dvae`)
# ChatTTS's DVAE encode path (voice cloning: a recording -> spk_smp codes). Always FP32 and
# byte-identical across variants (its codes must equal ChatTTS's); optional: artifacts converted
# before it existed lack it, and only voice cloning then fails.
DVAE_ENCODER = "dvae_encoder"
VOCODER = "vocos"  # always FP32, byte-identical across variants
# The graphs of an artifact, in the order convert writes them.
COMPONENTS = (EMBED, GPT, HEAD_CODE, HEAD_TEXT, DECODER, DVAE, DVAE_ENCODER, VOCODER)
# The optional fused GPT graph (quantize.fast_gpt_graph); the runtime prefers it when present.
FAST_GPT = "gpt_fast"
FAST_GPT_FILE = f"{FAST_GPT}.onnx"
# A graph's weights may live beside it in `<file>.data` (ONNX external data); its record then has
# `external_data` = {"file", "bytes", "sha256"}, while `sha256`/`bytes` describe the graph file.
EXTERNAL_DATA_SUFFIX = ".data"
# The graphs the CPU runtime runs per request keep their weights there, page aligned, so that
# onnxruntime memory-maps them instead of parsing a copy (chattts_forge.graph_storage). The other
# graphs (the plain GPT and the heads the quantizers read, the text head, the DVAE encoder) stay
# inline.
EXTERNAL_DATA_COMPONENTS = (EMBED, FAST_GPT, DECODER, DVAE, VOCODER)
# A serialized ONNX protobuf cannot exceed 2 GB: graphs near it keep their weights in external data.
PROTOBUF_LIMIT = 2 * 1024**3 - 64 * 1024**2
# Support files: artifact.json `files` key -> file name (the default when `files` omits the key).
# artifact.json records each as {"file", "bytes", "sha256"} (the shape of a component's
# `external_data`), so the runtime can check every file it opens; artifacts converted before that
# recorded the bare file name, which readers still accept (`support_file`, `support_record`).
SUPPORT_FILES = {
    "tokenizer": "tokenizer.json",
    "speaker_stats": "speaker_stats.npy",
    "homophones": "homophones_map.json",
    "dvae_coef": "dvae_coef.json",
}
# Support files the runtime does not read (older artifacts lack them): checked only when present.
OPTIONAL_SUPPORT_FILES = ("dvae_coef",)

# ---- variants, quantization methods, precisions ----------------------------------------------

FLOAT_VARIANTS = ("fp32", "fp16")


class QuantizeMethod(Choice):
    """`quantize --method` (the registry's classes, quantize/methods.py). auto: a per-MatMul
    FP32 / INT8 / INT4 assignment searched against a gate (quantize/auto.py)."""

    DYNAMIC = "dynamic"
    STATIC = "static"
    INT4 = "int4"
    AUTO = "auto"


class KvCache(Choice):
    """The fused GPT graph's key/value cache (`quantize --kv-cache`). An INT8 cache makes its own
    variant, the method's variant plus a suffix, so it is published beside the float-cache one."""

    FP32 = "fp32"
    INT8 = "int8"


class DecoderWeights(Choice):
    """The Decoder's MatMuls in quantized variants (`quantize --decoder`): weight-only INT8 computed in
    float (the default: streamed audio equals whole-text audio), the same with int8 activations
    ("int8-a8": faster, but a rounding difference at a stream window's edge flips activation codes,
    so streams are inexact), or FP32."""

    INT8 = "int8"
    INT8_A8 = "int8-a8"
    FP32 = "fp32"


QUANTIZE_METHODS = QuantizeMethod.values()
METHOD_VARIANT = {"dynamic": "int8-dynamic", "static": "int8-static", "int4": "int4", "auto": "auto"}
# The `precision` a quantized component records (also its ONNX metadata_props `precision`).
METHOD_PRECISION = {"dynamic": "int8", "static": "int8", "int4": "int4", "auto": "mixed"}
KV_CACHES = KvCache.values()
DECODER_WEIGHTS = DecoderWeights.values()
KV_CACHE_SUFFIX = {"fp32": "", "int8": "-kv8"}


def quantized_variant(method: str, kv_cache: str = "fp32") -> str:
    """The variant `quantize --method METHOD --kv-cache KV_CACHE` writes (e.g. int8-dynamic-kv8)."""
    if method not in METHOD_VARIANT:
        raise BadInput(f"unknown method '{method}' (choose from: {', '.join(QUANTIZE_METHODS)})")
    if kv_cache not in KV_CACHE_SUFFIX:
        raise BadInput(f"unknown KV cache '{kv_cache}' (choose from: {', '.join(KV_CACHES)})")
    return METHOD_VARIANT[method] + KV_CACHE_SUFFIX[kv_cache]


# The INT8-cache variants the build makes: variant -> (method, kv cache). Dynamic INT8 only: static
# and auto quantize the fused graph with calibrated activations and keep a float cache, and the
# build's int4 is GPTQ, whose fused graph keeps one too (only an rtn int4 rebuild takes an int8 cache).
KV_CACHE_VARIANTS = {quantized_variant("dynamic", "int8"): ("dynamic", "int8")}
VARIANT_METHOD = {variant: method for method, variant in METHOD_VARIANT.items()} | {
    variant: method for variant, (method, _) in KV_CACHE_VARIANTS.items()
}
# A variant's KV cache, for the variants the build makes (every other one: fp32).
VARIANT_KV_CACHE = {variant: kv for variant, (_, kv) in KV_CACHE_VARIANTS.items()}
VARIANTS = FLOAT_VARIANTS + tuple(METHOD_VARIANT.values()) + tuple(KV_CACHE_VARIANTS)


def component_file_name(component: str) -> str:
    """The default file of a component (artifact.json may name another)."""
    return f"{component}.onnx"


# ---- artifact.json ---------------------------------------------------------------------------

# Top-level keys a fresh artifact.json has, in the order they are written (convert's document).
BASE_KEYS = (
    "schema", "name", "variant", "dims", "audio", "tokens", "components", "files", "source", "fp16",
    "quantization", "versions", "toolchain", "created_at",
)  # fmt: skip
# Written by quantize after the base keys (null when fidelity was not measured).
QUANTIZED_KEYS = ("fidelity",)


@dataclass(kw_only=True)
class ArtifactMeta:
    """`artifact.json`, typed. Sections stay JSON objects (their keys are documented in
    docs/artifact-format.md); component entries are {"file", "precision", "sha256", "bytes", ...}.

    `to_dict()` writes the keys a loaded document had, in its order, then any newly set ones, so a
    load -> write round trip gives the same bytes; unknown top-level keys are kept in `extra`.
    """

    schema: str = SCHEMA
    name: str | None = "chattts"
    variant: str
    dims: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    tokens: dict[str, int] | None = None
    components: dict[str, dict[str, Any]]
    files: dict[str, dict[str, Any] | str] | None = None
    source: dict[str, Any] | None = None
    fp16: dict[str, Any] | None = None
    quantization: dict[str, Any] | None = None
    versions: dict[str, Any] | None = None
    toolchain: dict[str, Any] | None = None
    created_at: str | None = None
    fidelity: dict[str, Any] | None = None
    # The measured stream look-ahead (runtime.stream_lookahead); absent from artifacts made before it,
    # which stream exactly.
    streaming: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Key order of the loaded document (empty for a fresh one); where: the file, for messages.
    key_order: tuple[str, ...] = field(default=(), repr=False, compare=False)
    where: str = field(default=ARTIFACT_JSON, repr=False, compare=False)

    # -- reading --------------------------------------------------------------------------------

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> ArtifactMeta:
        """Read and validate `<folder>/artifact.json`; a missing or broken one is a one-line ForgeError."""
        folder = Path(folder).expanduser()
        path = folder / ARTIFACT_JSON
        if not folder.is_dir():
            raise NotFound(f"artifact folder {folder} does not exist")
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ForgeError(f"{folder} is not an artifact folder ({ARTIFACT_JSON} is missing)") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise BadInput(f"{path} is unreadable: {e}") from None
        return cls.from_dict(doc, where=str(path))

    @classmethod
    def from_dict(cls, doc: Any, where: str = ARTIFACT_JSON) -> ArtifactMeta:
        """Validate a parsed artifact.json (schema, variant, components; types of the sections)."""
        if not isinstance(doc, dict):
            raise BadInput(f"{where}: not a JSON object")
        if doc.get("schema") != SCHEMA:
            raise ForgeError(f"{where}: schema {doc.get('schema')!r} is not {SCHEMA!r}")
        if not isinstance(doc.get("variant"), str):
            raise BadInput(f"{where}: 'variant' is missing or not a string")
        comps = doc.get("components")
        if not isinstance(comps, dict) or not all(isinstance(c, dict) for c in comps.values()):
            raise BadInput(f"{where}: 'components' is missing or not a mapping of component entries")
        known = _document_keys()
        for key in set(known) - {"schema", "name", "variant", "created_at"}:
            if doc.get(key) is not None and not isinstance(doc[key], dict):
                raise BadInput(f"{where}: '{key}' is not a JSON object")
        for name, entry in comps.items():
            check_component_record(entry, f"{where}: components.{name}")
        check_files_section(doc.get("files"), where)
        check_streaming_section(doc.get("streaming"), where)
        # A key the document lacks stays absent when it is written again (name has a default).
        values = {"name": None} | {k: v for k, v in doc.items() if k in known}
        extra = {k: v for k, v in doc.items() if k not in known}
        return cls(**values, extra=extra, key_order=tuple(doc), where=where)

    def component(self, name: str) -> dict[str, Any]:
        """The artifact.json entry of a component."""
        info = self.components.get(name)
        if info is None:
            raise ForgeError(f"{self.where} lists no component '{name}'")
        return info

    def has_component(self, name: str) -> bool:
        return name in self.components

    def component_path(self, folder: str | os.PathLike[str], name: str) -> Path:
        """Where a component's graph is (it may be missing: see `component_file`); a recorded file that
        is absolute, climbs out with `..` or links out of `folder` is a one-line ForgeError."""
        rel = self.component(name).get("file", component_file_name(name))
        return resolve_inside(folder, rel, file=self.where, field=f"components.{name}.file")

    def external_data_path(self, folder: str | os.PathLike[str], name: str) -> Path | None:
        """The external-data file a component's record names (`external_data.file`, beside its graph),
        confined like `component_path`; None when the record names none."""
        data = self.component(name).get("external_data")
        if data is None:
            return None
        if not isinstance(data, dict) or "file" not in data:
            raise BadInput(f"{self.where}: components.{name}.external_data must be an object with a 'file'")
        graph = self.component_path(folder, name)
        # Inside the graph's folder, which is inside `folder`: so inside `folder` too.
        return resolve_inside(graph.parent, data["file"], file=self.where, field=f"components.{name}.external_data.file")

    def component_file(self, folder: str | os.PathLike[str], name: str) -> Path:
        """A component's graph file, which must exist."""
        path = self.component_path(folder, name)
        if not path.is_file():
            raise ForgeError(f"component '{name}' file {path} is missing")
        return path

    def component_files(self, folder: str | os.PathLike[str], name: str) -> list[Path]:
        """A component's graph file plus its external-data file, if any."""
        main = self.component_file(folder, name)
        data = main.with_name(main.name + EXTERNAL_DATA_SUFFIX)
        return [main, data] if data.is_file() else [main]

    def support_file(self, key: str) -> str:
        """The file name of a support file (`SUPPORT_FILES` keys), as recorded or by default."""
        value = (self.files or {}).get(key, SUPPORT_FILES[key])
        if isinstance(value, dict):
            value = value.get("file", SUPPORT_FILES[key])
        if not isinstance(value, str) or not value:
            raise ForgeError(f"{self.where}: files.{key} names no file")
        return value

    def support_record(self, key: str) -> dict[str, Any] | None:
        """A support file's {"file", "bytes", "sha256"} record; None when artifact.json has none (older
        artifacts recorded only the file name)."""
        value = (self.files or {}).get(key)
        return value if isinstance(value, dict) else None

    def support_path(self, folder: str | os.PathLike[str], key: str) -> Path:
        """Where a support file is in `folder`, confined to it (`files.KEY`: no absolute path, no `..`,
        no symbolic link out; else a one-line ForgeError naming artifact.json and the key)."""
        return resolve_inside(folder, self.support_file(key), file=self.where, field=f"files.{key}")

    def stream_lookahead(self) -> int | None:
        """The recorded stream look-ahead in mel frames (`streaming.lookahead_frames`); None when the
        artifact records none (it streams exactly)."""
        return None if self.streaming is None else self.streaming["lookahead_frames"]

    def require_dims(self) -> Dims:
        """The checkpoint dimensions (`dims`), which the runtime needs."""
        try:
            return Dims.from_dict(self.dims)  # type: ignore[arg-type]
        except (KeyError, TypeError, AttributeError, ForgeError) as e:
            raise ForgeError(f"{self.where}: bad or missing 'dims' ({e})") from None

    # -- writing --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (the sections themselves, not copies)."""
        values = {key: getattr(self, key) for key in _document_keys()}
        values.update(self.extra)
        keys = list(self.key_order or BASE_KEYS)
        wanted = [k for k in values if values[k] is not None or k in self.extra]
        if self.quantization is not None:
            wanted += QUANTIZED_KEYS
        keys += [k for k in dict.fromkeys(wanted) if k not in keys]
        return {k: values.get(k) for k in keys}

    def write(self, folder: str | os.PathLike[str]) -> Path:
        """Write `<folder>/artifact.json` atomically (temp file + rename); returns its path."""
        path = Path(folder) / ARTIFACT_JSON
        atomic_write_json(path, self.to_dict())
        return path


def _check_size_and_hash(rec: dict[str, Any], where: str) -> None:
    size, sha = rec.get("bytes"), rec.get("sha256")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise BadInput(f"{where}.bytes must be a whole number >= 0, got {size!r}")
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise BadInput(f"{where}.sha256 must be 64 lowercase hex digits, got {str(sha)[:80]!r}")


def check_component_record(rec: Any, where: str) -> None:
    """Types of the keys the stages read from a component entry: file (str), bytes (int >= 0), sha256
    (hex), external_data ({"file", "bytes", "sha256"}). Where it points is checked when it is used
    (`resolve_inside`)."""
    if not isinstance(rec, dict):
        raise BadInput(f"{where} is not a JSON object")
    if "file" in rec and not isinstance(rec["file"], str):
        raise BadInput(f"{where}.file must be a string, got {type(rec['file']).__name__}")
    _check_size_and_hash(rec, where)
    data = rec.get("external_data")
    if data is not None:
        if not isinstance(data, dict) or not isinstance(data.get("file"), str):
            raise BadInput(f"{where}.external_data must be an object with a 'file' string")
        _check_size_and_hash(data, f"{where}.external_data")


def check_files_section(files: Any, where: str) -> None:
    """`files`: {support file key: its record {"file", "bytes", "sha256"}, or a bare file name string
    (artifacts written before support files were hashed)}."""
    if files is None:
        return
    if not isinstance(files, dict):
        raise BadInput(f"{where}: files is not a JSON object")
    for key, value in files.items():
        if isinstance(value, str):
            continue
        if not isinstance(value, dict) or not isinstance(value.get("file"), str):
            raise BadInput(f"{where}: files.{key} must be a file record {{file, bytes, sha256}} or a file name string")
        _check_size_and_hash(value, f"{where}: files.{key}")


def check_streaming_section(streaming: Any, where: str) -> None:
    """`streaming`: its `lookahead_frames` (what the runtime reads) is a whole number of mel frames >= 1."""
    if streaming is None:
        return
    frames = streaming.get("lookahead_frames") if isinstance(streaming, dict) else None
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise BadInput(f"{where}: streaming.lookahead_frames must be a whole number of mel frames >= 1, got {frames!r}")


def _document_keys() -> tuple[str, ...]:
    """The ArtifactMeta fields that are artifact.json keys (not its bookkeeping), in field order."""
    return tuple(f.name for f in fields(ArtifactMeta) if f.name not in ("extra", "key_order", "where"))


# ---- the quantization record (artifact.json `quantization`) ----------------------------------
# Written once by the quantize stage's method object (chattts_forge.quantize.methods); field order
# is key order in artifact.json. Fields marked `_OMITTED_WHEN_NONE` are absent (not null) when unset,
# as they always were, so records written before these types existed keep their bytes.

_OMITTED_WHEN_NONE = {"omit_none": True}


def _record_dict(record: Any) -> dict[str, Any]:
    """A record dataclass as its JSON object: fields in order, nested records converted."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if value is None and f.metadata.get("omit_none"):
            continue
        out[f.name] = value.to_dict() if hasattr(value, "to_dict") else value
    return out


def _record_values(cls: type, doc: Any, what: str) -> dict[str, Any]:
    """The fields of `cls` read from a JSON object; unknown or missing non-optional keys are refused."""
    if not isinstance(doc, dict):
        raise BadInput(f"{what}: not a JSON object")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(doc) - names)
    if unknown:
        raise BadInput(f"{what}: unknown key(s) {', '.join(unknown)}")
    required = [f.name for f in fields(cls) if not f.metadata.get("omit_none") and f.name not in doc]
    if required:
        raise ForgeError(f"{what}: missing key(s) {', '.join(required)}")
    return dict(doc)


@dataclass(kw_only=True)
class QuantizationOptions:
    """`quantization.options`: the options the method ran with; the ones it does not use are null
    (static's activation settings; the INT4 block settings, which int4 and auto's INT4 MatMuls use)."""

    per_channel: bool
    calibrate_method: str | None  # static only
    activation_type: str | None  # static only
    symmetric_activations: bool | None  # static only
    block_size: int | None  # int4 and auto
    accuracy_level: int | None  # int4 and auto
    algorithm: str | None = field(default=None, metadata=_OMITTED_WHEN_NONE)  # int4 only: rtn | k_quant | gptq
    smooth_alpha: float | None = field(default=None, metadata=_OMITTED_WHEN_NONE)  # static: SmoothQuant's alpha
    percentile: float | None = field(default=None, metadata=_OMITTED_WHEN_NONE)  # static percentile ranges
    weight_bits: int | None = field(default=None, metadata=_OMITTED_WHEN_NONE)  # static, when not 7: 8 (VNNI CPUs)
    quantize_head: bool
    decoder: str  # DECODER_WEIGHTS
    exclude_patterns: list[str]
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return _record_dict(self)

    @classmethod
    def from_dict(cls, doc: Any) -> QuantizationOptions:
        return cls(**_record_values(cls, doc, "quantization.options"))


@dataclass(kw_only=True)
class Quantization:
    """`artifact.json` -> `quantization` of a quantized variant (docs/artifact-format.md).

    `per_channel`, `block_size` and `accuracy_level` at the top level are the options a fast graph
    rebuild takes (`quantize.fast_gpt.optimize_artifact` reads them): block settings
    only for the method whose fused graph such a rebuild quantizes in blocks (int4), unlike
    `options`, which records what the method itself used.
    """

    method: str  # QUANTIZE_METHODS
    variant: str
    tool: str
    source_artifact: dict[str, Any]  # {"path", "variant", "artifact_json_sha256", "gpt_sha256"}
    options: QuantizationOptions
    components: dict[str, dict[str, Any]]  # per graph: the quantizer's record, excluded nodes, ops
    not_quantized: dict[str, str]  # component -> why it stayed FP32
    gpt_fast: str | None  # what became of the fused GPT graph
    per_channel: bool
    block_size: int | None
    accuracy_level: int | None
    excluded_nodes: list[str]
    calibration: dict[str, Any] | None  # CalibrationStore.describe
    algorithm: str | None = field(default=None, metadata=_OMITTED_WHEN_NONE)  # int4 only
    auto: dict[str, Any] | None = field(default=None, metadata=_OMITTED_WHEN_NONE)  # auto only: its search
    fallback: dict[str, Any] | None  # the accuracy-driven fallback's steps (fidelity targets)
    sizes: dict[str, Any]  # {"gpt_fp32_bytes", "gpt_bytes", "gpt_ratio"}
    vocos_sha256_equal: bool | None
    copied_files: list[str]
    kv_cache: dict[str, Any] | None = field(default=None, metadata=_OMITTED_WHEN_NONE)  # an int8 KV cache only

    def to_dict(self) -> dict[str, Any]:
        """The JSON object artifact.json stores (keys in field order)."""
        return _record_dict(self)

    @classmethod
    def from_dict(cls, doc: Any) -> Quantization:
        """A loaded artifact.json's `quantization` block, checked for its keys."""
        values = _record_values(cls, doc, "quantization")
        values["options"] = QuantizationOptions.from_dict(values["options"])
        return cls(**values)


# ---- writing a component's graph -------------------------------------------------------------


def with_record_fields(record: dict[str, Any], **fields_: Any) -> dict[str, Any]:
    """`record` (a component entry) with `fields_` added; `external_data` stays its last key, where
    every stage has always written it."""
    data = record.get("external_data")
    out = {k: v for k, v in record.items() if k != "external_data"} | fields_
    if data is not None:
        out["external_data"] = data
    return out


# ---- the fidelity record (artifact.json `fidelity`, the report's `fidelity`) -----------------
# Written by `quantize.fidelity.summarize_fidelity` (the quantize stage stores it in artifact.json,
# evaluate in its report); read through this type, whose `gate_metrics` is the one mapping of a
# fidelity record to the gate's metric names (chattts_forge.gate).


@dataclass(kw_only=True)
class Fidelity:
    """A fidelity measurement against the FP32 reference (docs/artifact-format.md, `chattts_forge.quantize`):
    teacher-forced code agreement and KL per stream, hidden-state cosine, mel after the Decoder; the
    fused graph's own figures under `gpt_fast`. A search candidate's record has only the three figures."""

    reference: str | None = field(default=None, metadata=_OMITTED_WHEN_NONE)
    corpus: dict[str, Any] | None = field(default=None, metadata=_OMITTED_WHEN_NONE)
    method: str | None = field(default=None, metadata=_OMITTED_WHEN_NONE)
    settings: dict[str, Any] | None = field(default=None, metadata=_OMITTED_WHEN_NONE)
    teacher_forced: dict[str, Any]  # {"top1_agreement": {"mean", "min_stream", ...}, "kl": {"mean", "max_stream", ...}}
    hidden_cosine: dict[str, float]  # {"mean", "min"}
    mel: dict[str, Any]  # {"snr_db", "lsd_db", "frames"}
    gpt_fast: dict[str, Any] | None = field(default=None, metadata=_OMITTED_WHEN_NONE)  # {"teacher_forced", "hidden_cosine"} | {"error"}
    per_tensor: dict[str, Any] | None = field(default=None, metadata=_OMITTED_WHEN_NONE)
    per_tensor_unavailable: str | None = field(default=None, metadata=_OMITTED_WHEN_NONE)

    def to_dict(self) -> dict[str, Any]:
        return _record_dict(self)

    @classmethod
    def from_dict(cls, doc: Any, what: str = "fidelity") -> Fidelity:
        return cls(**_record_values(cls, doc, what))

    def gate_metrics(self, fused: bool = True) -> dict[str, float]:
        """The gate's fidelity metrics (chattts_forge.gate.FIDELITY_METRICS). The runtime runs the fused
        gpt_fast graph when the artifact has one (with its own KV cache precision), gpt.onnx otherwise:
        with `fused`, each metric is the worse of the GPT graphs measured; without, gpt.onnx's."""
        fast = self.gpt_fast or {}
        measured = fused and "teacher_forced" in fast
        tfs = [self.teacher_forced] + ([fast["teacher_forced"]] if measured else [])
        coss = [self.hidden_cosine] + ([fast["hidden_cosine"]] if measured else [])
        return {
            "code_agreement": min(t["top1_agreement"]["mean"] for t in tfs),
            "code_agreement_stream": min(t["top1_agreement"]["min_stream"] for t in tfs),
            "code_kl": max(t["kl"]["mean"] for t in tfs),
            "code_kl_stream": max(t["kl"]["max_stream"] for t in tfs),
            "hidden_cosine": min(c["mean"] for c in coss),
            "hidden_cosine_min": min(c["min"] for c in coss),
            "mel_snr_db": self.mel["snr_db"],
            "mel_lsd_db": self.mel["lsd_db"],
        }
