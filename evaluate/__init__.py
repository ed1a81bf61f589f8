"""The evaluate stage: the quality gate (intelligibility, fidelity, latency, size) and its reports.

Commands: ``chattts-forge evaluate --artifact DIR --reference FP32_DIR --corpus FILE [--gate GATE.toml]
--out REPORT_DIR`` (exit 0 pass, 1 gate failed, 2 bad input) and ``chattts-forge score --audio-dir DIR
[--transcripts FILE] [--speaker-reference WAV|DIR] [--mos] [--asr NAME] [--asr-model DIR] [--lang en|zh]
[--json OUT]`` (docs/scoring.md).

Library (torch is never imported, except by `latency.measure_pytorch` when a baseline is asked for):

- `evaluate.evaluate_artifact(artifact, reference, EvaluateConfig(corpus=..., gate=None, out=None, ...))`
  (or `evaluate_artifact(artifact, reference, corpus, **EvaluateConfig fields)`) -> sealed report
  dict; writes report.json / report.md / report.html (`report.write_reports`). Its phases:
  `prepare`, `reference_side`, `measure_latency`, `corpus_phase`, hearing, the gate, `serving_sections`
  (buckets, phrase cache); the report around them is assembled by `report_assembly` (`describe_artifact`,
  `flat_metrics`, `memory_section`, `report_body`, `waivers`, `report_notes`).
- `evaluate_config`: `EvaluateConfig` (the settings `EvaluateSettings` shared with `evaluate-reference`
  and `evaluate-latency`, `LatencyRunConfig`), every option of those commands declared once on its field.
- `reference_run.evaluate_reference(reference, out, config)` (``chattts-forge evaluate-reference``):
  the FP32 reference's side of every evaluation (latency run and audio, PyTorch baseline, ASR of its
  audio), measured once per build and read by ``evaluate --reference-run DIR``.
- `report_record.ReportRecord` (and `latency_record`): report.json as typed records; `SealedReport.record`
  is how readers take it.
- `report_schema`: the report.json contract, shared with publish: `write_report` (atomic, validated),
  `seal`, `read_report` (seal verified, strict keys) -> `SealedReport`, `validate`; layout documented there.
- `markdown_html.to_html(markdown)`: the Markdown subset the reports use, as HTML (report.html's summary).
- `score.score_audio_dir(audio_dir, transcripts=None, ScoreSettings(asr="faster-whisper", asr_model=None,
  lang=None, speaker_reference=None, mos=False))`, `score.score_waveforms(...)`, `score.error_rates(...)`,
  `score.seed_tts_eval_rates(...)` (Seed-TTS-eval's run_wer.py rules), `score.read_transcripts(path)`.
- `speaker.SpeakerEncoder.load()` / `.embed(audio, sr)` / `.embed_many(...)`, `speaker.similarity`,
  `speaker.pooled_reference`: GE2E speaker similarity (resemblyzer's weights, numpy).
- `naturalness.Dnsmos.load()` / `.score(audio, sr)`: DNSMOS SIG/BAK/OVRL and P.808 (speechmos' ONNX models).
- `stats.bootstrap_interval`, `stats.bootstrap_ratio_interval`, `stats.paired_bootstrap_interval`:
  95% bootstrap intervals over sentences.
- `asr.get_backend(name, lang, model_dir=None, threads=None)`: faster-whisper (tiny.en / Whisper base
  from the asr wheels, or any faster-whisper folder) and pocketsphinx; `asr.load_audio`, `asr.resample`.
- `textnorm.normalize(text, lang)`: Seed-TTS-eval style scoring normalisation (numbers as words).
- `gate.load_gate(path)`, `gate.judge(gate, metrics, waived)`: a re-export of `chattts_forge.gate`, the
  one judge (shipped thresholds in chattts_forge/gate/default_gate.toml).
- `latency.measure_artifact(...)`, `latency.measure_pytorch(...)`: the gate's latency workload on the
  engines of `chattts_forge.runtime.timing` (shared with `bench` and `quantize.stepbench`).
- `degrade`: white noise, hard clipping, bit-crushing, time-stretch (numpy), and
  `damage_quantization_scales(src, dst, factor)` to build a deliberately broken quantized artifact.
"""
