"""The measurement and provenance sections of report.json as typed records (evaluate.report_record
holds the top level and imports these).

Each type is read off the code that writes its section (named on the type) and checked against
every report.json a build has written: fields are declared in the order the writer puts them, so
the encoder gives the same bytes back. A field some writer leaves out (a section not measured,
a report written before the field existed, the tests' stand-in reports that write the section
empty) is ``X | UnsetType = UNSET``: absent on reading, left out on encoding. Numbers the report
seals may be null (`report_schema.seal` writes NaN and infinities as null), so measured figures are
`OptNumber`; int | float keeps an integral value as the int it was written as (msgspec would make
1 into 1.0 for a plain float field and change the bytes).
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET, Struct, UnsetType

from chattts_forge.evaluate.latency_record import Number, OptNumber

# ---- fidelity: quantize.fidelity.summarize_fidelity / measure_fidelity (artifact.Fidelity's shape)


class FidelityCorpus(Struct, forbid_unknown_fields=True):
    name: str
    sha256: str
    sentences_used: int


class FidelitySettings(Struct, forbid_unknown_fields=True):
    max_sentences: int
    max_new_token: int
    seed: int


class StreamFigures(Struct, forbid_unknown_fields=True):
    """A per-stream figure (code_metrics): its mean, its worst stream and every stream's."""

    mean: OptNumber
    min_stream: OptNumber | UnsetType = UNSET  # top1_agreement's worst
    max_stream: OptNumber | UnsetType = UNSET  # kl's worst
    per_stream: list[OptNumber] | UnsetType = UNSET


class TeacherForced(Struct, forbid_unknown_fields=True):
    """quantize.fidelity.code_metrics: top-1 code agreement and KL(fp32 || q) per stream."""

    top1_agreement: StreamFigures
    kl: StreamFigures
    steps: int


class MeanMin(Struct, forbid_unknown_fields=True):
    mean: OptNumber
    min: OptNumber


class MelFigures(Struct, forbid_unknown_fields=True):
    snr_db: OptNumber
    lsd_db: OptNumber
    frames: int


class FastGptFidelity(Struct, forbid_unknown_fields=True):
    """The fused gpt_fast graph's own figures, or why it could not be replayed."""

    teacher_forced: TeacherForced | UnsetType = UNSET
    hidden_cosine: MeanMin | UnsetType = UNSET
    error: str | UnsetType = UNSET


class TensorErrorRow(Struct, forbid_unknown_fields=True, kw_only=True):
    """A row of quantize.fidelity.tensor_errors (worst_output keeps node, rel_error and cosine)."""

    node: str
    op_type: str | UnsetType = UNSET
    tensor: str | UnsetType = UNSET
    rel_error: OptNumber
    cosine: OptNumber
    input_rel_error: OptNumber | UnsetType = UNSET
    local_error: OptNumber | UnsetType = UNSET
    producer_of_input: str | None | UnsetType = UNSET


class PerTensorTable(Struct, forbid_unknown_fields=True):
    """quantize.fidelity.ReplaySessions.tensor_table."""

    graph: str
    samples: int
    tensors_compared: int
    worst_local: list[TensorErrorRow]
    worst_output: list[TensorErrorRow]
    all_local: list[TensorErrorRow] | None | UnsetType = UNSET  # dropped by quantize before artifact.json
    head_code_rel_error: OptNumber | UnsetType = UNSET


class FidelityRecord(Struct, forbid_unknown_fields=True):
    """A fidelity measurement against the FP32 reference (quantize.measure_fidelity's record; the
    report's top level and each bucket's). Empty in the tests' stand-in reports, so every field may
    be absent."""

    reference: str | UnsetType = UNSET
    corpus: FidelityCorpus | UnsetType = UNSET
    method: str | UnsetType = UNSET
    settings: FidelitySettings | UnsetType = UNSET
    teacher_forced: TeacherForced | UnsetType = UNSET
    hidden_cosine: MeanMin | UnsetType = UNSET
    mel: MelFigures | UnsetType = UNSET
    gpt_fast: FastGptFidelity | UnsetType = UNSET
    per_tensor: PerTensorTable | UnsetType = UNSET
    per_tensor_unavailable: str | UnsetType = UNSET


# ---- intelligibility: evaluate.evaluate (measured) or its synthetic-checkpoint note; buckets' too


class AsrVariantScores(Struct, forbid_unknown_fields=True):
    """One variant's ASR scores in one language (evaluate.score's `corpus` and `utterances`). Their
    keys vary with the scoring (number normalisation, seed-tts-eval, voice scores) and no published
    report holds them yet to check a record type against: maps, as evaluate.score writes them."""

    corpus: dict[str, Any]
    utterances: list[dict[str, Any]]


class IntelligibilityLanguage(Struct, forbid_unknown_fields=True):
    """evaluate.evaluate.score_languages' entry of a language."""

    asr: dict[str, Any] | None  # the ASR backend's describe(): its keys are each backend's own
    variants: dict[str, AsrVariantScores]  # artifact | reference -> its scores


class IntelligibilitySection(Struct, forbid_unknown_fields=True):
    """ASR error rates of both variants (evaluate.evaluate.intelligibility), or why not measured
    (``{"measured": false, "reason", "note"}``; a bucket's may be ``{"measured": false}`` alone,
    tests/data/records/report-before-memory.json's is empty)."""

    measured: bool | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    note: str | UnsetType = UNSET
    languages: dict[str, IntelligibilityLanguage] | UnsetType = UNSET  # language -> its scores
    wer: OptNumber | UnsetType = UNSET
    reference_wer: OptNumber | UnsetType = UNSET
    wer_delta: OptNumber | UnsetType = UNSET
    cer: OptNumber | UnsetType = UNSET
    reference_cer: OptNumber | UnsetType = UNSET
    cer_delta: OptNumber | UnsetType = UNSET


# ---- speaker and naturalness: evaluate.listening


class SpeakerEncoderInfo(Struct, forbid_unknown_fields=True):
    """evaluate.speaker.SpeakerEncoder.describe."""

    model: str
    weights: str
    weights_sha256: str
    embedding: int
    vad: str


class SimilarityRow(Struct, forbid_unknown_fields=True):
    id: str
    text: str
    similarity: OptNumber


class CloneSimilarity(Struct, forbid_unknown_fields=True):
    recording: str
    sentences: list[SimilarityRow]
    mean: OptNumber
    min: OptNumber


class SpeakerSection(Struct, forbid_unknown_fields=True):
    """evaluate.listening.speaker_section: GE2E similarity to the FP32 audio, or why not measured."""

    measured: bool
    synthetic_only: bool | UnsetType = UNSET
    reason: str | None | UnsetType = UNSET
    encoder: SpeakerEncoderInfo | UnsetType = UNSET
    definition: str | UnsetType = UNSET
    sentences: list[SimilarityRow] | UnsetType = UNSET
    mean: OptNumber | UnsetType = UNSET
    min: OptNumber | UnsetType = UNSET
    clone: CloneSimilarity | None | UnsetType = UNSET


class DnsmosScores(Struct, forbid_unknown_fields=True):
    sig: OptNumber
    bak: OptNumber
    ovrl: OptNumber
    p808: OptNumber | UnsetType = UNSET


class DnsmosModel(Struct, forbid_unknown_fields=True):
    """evaluate.naturalness.Dnsmos.describe."""

    model: str
    p835: str
    p808: str


class NaturalnessRow(Struct, forbid_unknown_fields=True):
    id: str
    text: str
    artifact: DnsmosScores
    reference: DnsmosScores
    ovrl_drop: OptNumber


class NaturalnessSection(Struct, forbid_unknown_fields=True):
    """evaluate.listening.naturalness_section: DNSMOS of both variants, or why not measured."""

    measured: bool
    synthetic_only: bool | UnsetType = UNSET
    reason: str | None | UnsetType = UNSET
    model: DnsmosModel | str | UnsetType = UNSET  # a scorer without describe(): its fixed name
    sentences: list[NaturalnessRow] | UnsetType = UNSET
    artifact: DnsmosScores | UnsetType = UNSET
    reference: DnsmosScores | UnsetType = UNSET
    ovrl_drop: OptNumber | UnsetType = UNSET


# ---- streaming: evaluate.seams.measure_seams


class SeamRow(Struct, forbid_unknown_fields=True):
    """One sentence streamed against its whole synthesis (evaluate.seams.compare_stream)."""

    id: str
    text: str
    samples: int
    length_difference: int
    chunks: int
    edges: list[int]
    max_abs_diff: OptNumber
    snr_db: OptNumber
    click_db: OptNumber
    edge_over_rest_db: OptNumber


class StreamingMode(Struct, forbid_unknown_fields=True):
    lookahead_frames: int
    source: str  # exact | recorded | option | fixed
    sentences: list[SeamRow]
    snr_db_min: OptNumber
    snr_db_mean: OptNumber
    max_abs_diff: OptNumber
    click_db_max: OptNumber


class LookaheadPoint(Struct, forbid_unknown_fields=True):
    lookahead_frames: int
    snr_db_min: OptNumber


class RecordedLookahead(Struct, forbid_unknown_fields=True):
    """artifact.json's `streaming` record (runtime.stream_lookahead.measure_lookahead writes every key;
    artifact.json's own check requires only `lookahead_frames`, what the runtime reads)."""

    lookahead_frames: int
    exact_frames: int | UnsetType = UNSET
    threshold_db: Number | UnsetType = UNSET
    margin_db: Number | UnsetType = UNSET
    curve: list[LookaheadPoint] | UnsetType = UNSET
    sentences: int | UnsetType = UNSET
    stream_batch: int | UnsetType = UNSET
    max_new_token: int | UnsetType = UNSET
    seed: int | UnsetType = UNSET


class StreamingSection(Struct, forbid_unknown_fields=True):
    measured: bool
    reason: str | UnsetType = UNSET
    stream_batch: int | UnsetType = UNSET
    definition: str | UnsetType = UNSET
    recorded_lookahead_frames: int | None | UnsetType = UNSET
    recorded: RecordedLookahead | None | UnsetType = UNSET
    modes: dict[str, StreamingMode] | UnsetType = UNSET  # default | lookahead | recorded -> its seams


# ---- provenance: corpus, settings, machine, versions, toolchain, timing (evaluate.report_assembly)


class CorpusSection(Struct, forbid_unknown_fields=True):
    """calibration_data.corpus.Corpus.describe with the sentences used and the spec evaluated; the
    stand-in reports write name and sentences_used alone."""

    name: str | UnsetType = UNSET
    sha256: str | UnsetType = UNSET
    sentences: int | UnsetType = UNSET
    language: str | None | UnsetType = UNSET
    files: list[str] | UnsetType = UNSET
    file_sha256: dict[str, str] | UnsetType = UNSET  # file name -> its sha256
    sentences_used: int | UnsetType = UNSET
    spec: str | UnsetType = UNSET


class SettingsSection(Struct, forbid_unknown_fields=True):
    """The evaluate options the figures were measured with (empty in stand-in reports)."""

    max_sentences: int | None | UnsetType = UNSET
    max_new_token: int | UnsetType = UNSET
    threads: int | None | UnsetType = UNSET
    bucket_sentences: int | UnsetType = UNSET
    cache_phrases: int | UnsetType = UNSET
    seed: int | UnsetType = UNSET
    batch_sizes: list[int] | UnsetType = UNSET
    fidelity_sentences: int | UnsetType = UNSET
    fidelity_steps: int | UnsetType = UNSET
    asr: str | UnsetType = UNSET
    asr_model: str | None | UnsetType = UNSET
    baseline_checkpoint: str | None | UnsetType = UNSET


class ToolchainInfo(Struct, forbid_unknown_fields=True):
    """chattts_forge.versions.toolchain_info (empty in stand-in reports)."""

    name: str | UnsetType = UNSET
    version: str | UnsetType = UNSET
    git_commit: str | None | UnsetType = UNSET


class RayProcess(Struct, forbid_unknown_fields=True):
    hostname: str
    pid: int
    role: str


class RayWorker(Struct, forbid_unknown_fields=True):
    """A Ray actor's place (evaluate.ray_shards.CorpusWorker.describe)."""

    hostname: str
    pid: int
    node_id: str
    node_ip: str | None  # None: the node not listed by ray.nodes()
    actor_id: str
    name: str


class RayPlacement(Struct, forbid_unknown_fields=True):
    """Where a Ray-sharded evaluation ran (evaluate.ray_shards)."""

    address: str
    workers: list[RayWorker]
    retries: int
    sharded: list[str]
    latency_measured_on: RayProcess


class MachineSection(Struct, forbid_unknown_fields=True):
    """runtime.machine.machine_info (stand-in reports: cpu_model and logical_cores alone;
    tests/data/records/report-before-memory.json's is empty)."""

    cpu_model: str | UnsetType = UNSET
    processor: str | UnsetType = UNSET
    logical_cores: int | None | UnsetType = UNSET
    cpu_count: int | None | UnsetType = UNSET
    physical_cores: int | None | UnsetType = UNSET
    memory_gb: Number | UnsetType = UNSET
    threads: int | None | UnsetType = UNSET
    provider: str | UnsetType = UNSET
    available_providers: list[str] | UnsetType = UNSET
    platform: str | UnsetType = UNSET
    python: str | UnsetType = UNSET
    load_avg_1m: OptNumber | UnsetType = UNSET
    versions: dict[str, str | None] | UnsetType = UNSET  # distribution -> version (None: not installed)
    toolchain: ToolchainInfo | UnsetType = UNSET
    ray: RayPlacement | UnsetType = UNSET


class TimingSection(Struct, forbid_unknown_fields=True):
    evaluate_seconds: Number | UnsetType = UNSET


# ---- per-sentence rows: evaluate.intervals.build


class SentenceRow(Struct, forbid_unknown_fields=True):
    """One held-out sentence's figures, gathered from the sections that measured it."""

    id: str | UnsetType = UNSET
    text: str | UnsetType = UNSET
    rtf: OptNumber | UnsetType = UNSET
    seconds: OptNumber | UnsetType = UNSET
    audio_seconds: OptNumber | UnsetType = UNSET
    wer: OptNumber | UnsetType = UNSET
    reference_wer: OptNumber | UnsetType = UNSET
    cer: OptNumber | UnsetType = UNSET
    reference_cer: OptNumber | UnsetType = UNSET
    similarity: OptNumber | UnsetType = UNSET
    ovrl: OptNumber | UnsetType = UNSET
    reference_ovrl: OptNumber | UnsetType = UNSET
    ovrl_drop: OptNumber | UnsetType = UNSET
    p808: OptNumber | UnsetType = UNSET
    code_agreement: OptNumber | UnsetType = UNSET
    code_kl: OptNumber | UnsetType = UNSET
    fidelity_steps: int | UnsetType = UNSET
    mel_snr_db: OptNumber | UnsetType = UNSET
    stream_snr_db: OptNumber | UnsetType = UNSET
    stream_click_db: OptNumber | UnsetType = UNSET
    stream_lookahead_snr_db: OptNumber | UnsetType = UNSET
    stream_lookahead_click_db: OptNumber | UnsetType = UNSET


# ---- inside artifact / memory / listen


class ArtifactSource(Struct, forbid_unknown_fields=True):
    """The checkpoint an artifact was converted from (report_assembly keeps these keys of
    artifact.json's `source`, the ones it has)."""

    kind: str | UnsetType = UNSET  # synthetic | real
    preset: str | None | UnsetType = UNSET
    seed: int | None | UnsetType = UNSET
    asset_dir: str | None | UnsetType = UNSET


class AutoSearchCandidate(Struct, forbid_unknown_fields=True):
    """A candidate of `quantize --method auto`'s search, as evaluate.search_report copies it (each key
    read with .get: null when the search did not record it)."""

    candidate: int | None
    head_code: str | None
    fp32: int | None
    int8: int | None
    int4: int | None
    bytes: int | None
    step_ms: OptNumber
    code_agreement: OptNumber
    hidden_cosine: OptNumber
    mel_snr_db: OptNumber
    passed: bool | None
    pareto: bool | None
    step_ms_search: OptNumber  # its first timing when the finalists were timed again


class AutoSearchSummary(Struct, forbid_unknown_fields=True):
    """evaluate.search_report.auto_search_summary: the auto search an artifact was chosen by."""

    gate: str  # the gate file's name
    gate_sha256: str | None
    headroom: OptNumber
    ranked_by: str | None
    block_size: int | None
    chosen: int | None
    head_code: str | None
    candidates: list[AutoSearchCandidate]
    # quantize.auto.retime's record, copied as the search wrote it: its comparison's candidates are
    # keyed by their labels and its layout is quantize.auto's own
    final_timing: dict[str, Any] | None
    most_sensitive: list[str | None]
    least_sensitive: list[str | None]


class MemoryProbe(Struct, forbid_unknown_fields=True, kw_only=True):
    """runtime.memory_probe.measure_memory's record: the probe's figures (printed with sorted keys),
    then the wall time and the settings; on failure the peaks are empty and `error` says why. A
    reader needs only `peak_rss_mb_by_batch` (runtime.serve.guard), so the rest may be absent."""

    after_load_mb: OptNumber | UnsetType = UNSET
    gpt_engine: str | UnsetType = UNSET
    load_peak_mb: OptNumber | UnsetType = UNSET
    peak_rss_mb: OptNumber | UnsetType = UNSET
    peak_rss_mb_by_batch: dict[str, OptNumber]  # batch size (as text) -> peak
    probe_seconds: OptNumber | UnsetType = UNSET
    python_baseline_mb: OptNumber | UnsetType = UNSET
    rss_method: str | UnsetType = UNSET
    error: str | UnsetType = UNSET
    seconds: OptNumber | UnsetType = UNSET
    steps: int | UnsetType = UNSET
    batches: list[int] | UnsetType = UNSET
    threads: int | None | UnsetType = UNSET
    provider: str | UnsetType = UNSET
    text: str | UnsetType = UNSET
    warmup_steps: int | UnsetType = UNSET
    command: str | UnsetType = UNSET
    method: str | UnsetType = UNSET


class SpectrogramSettings(Struct, forbid_unknown_fields=True):
    """The listen PNGs' mel settings (evaluate.listening)."""

    n_fft: int
    hop: int
    bands: int
