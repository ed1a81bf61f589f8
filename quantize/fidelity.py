"""Fidelity of a quantized artifact against its FP32 source, weight-agnostic (meaningful on random weights).

Method (teacher forcing): the FP32 artifact synthesizes each held-out sentence with the runtime while
its sessions are recorded (`calibration_data.recorder`); every GPT step's inputs (inputs_embeds,
attention mask, position ids), its hidden state and the code-head logits are kept. The quantized GPT
and head are then replayed on exactly those inputs, carrying their *own* key/value cache, so each
step sees the FP32 code history. Compared per step:

- top-1 agreement of the raw code logits, per code stream (argmax equal);
- KL(FP32 || quantized) of the softmaxed raw logits, per stream (nats);
- cosine similarity of the GPT's last hidden state;
- after the Decoder: mel SNR (dB) and log-spectral distance (dB; the Decoder output is treated as a
  natural-log mel amplitude, the Vocos convention, so dB = 20/ln 10 * difference);
- a per-tensor error table: both GPT graphs are run on recorded samples (a prefill and a decode step
  with past) with every constant-weight MatMul's input and output exposed; the relative L2 error of
  each tensor, and the error each node adds (output error minus input error), name the worst layers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from chattts_forge.artifact import DECODER, FAST_GPT, GPT, HEAD_CODE, ArtifactMeta, Fidelity
from chattts_forge.calibration_data.corpus import Corpus, load_corpus
from chattts_forge.calibration_data.recorder import (
    check_recorded,
    instrument,
    new_pipeline,
    synth_params,
)
from chattts_forge.checkpoint.layout import Dims
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger, quiet_logger
from chattts_forge.progress import track
from chattts_forge.quantize.config import FidelitySettings  # the one fidelity settings type
from chattts_forge.quantize.graph_ops import matmul_nodes_with_const_weight
from chattts_forge.runtime import GptStep, GptStepLike, LoadedArtifact, open_gpt_step

log = get_logger(__name__)

_DB_PER_NAT = 20.0 / np.log(10.0)


@dataclass
class Trajectory:
    """One sentence synthesized by the FP32 artifact, as the quantized graphs will replay it."""

    text: str
    step_feeds: list[dict[str, np.ndarray]] = field(default_factory=list)  # gpt feeds without past
    hidden: list[np.ndarray] = field(default_factory=list)  # FP32 last hidden state per step [B, H]
    logits: list[np.ndarray] = field(default_factory=list)  # FP32 head_code logits per step [B, vq, V]
    full_samples: list[dict[str, np.ndarray]] = field(default_factory=list)  # whole gpt feeds (with past)


# The GPT calls of a trajectory whose whole-graph inputs are kept (the prefill and one decode step):
# the per-tensor table and the fallback's step timing replay them.
FULL_SAMPLE_STEPS = (0, 12)


def record_trajectories(
    fp32_dir: Path,
    corpus: Corpus,
    settings: FidelitySettings,
    *,
    indices: Sequence[int] | None = None,
    pipe: Any = None,
) -> list[Trajectory]:
    """Synthesize up to `settings.max_sentences` corpus sentences with the FP32 artifact and record them
    (`max_new_token` GPT steps each, on `threads`, with `progress`; the per-tensor fields are unused here).

    `indices`: only these sentences of the first `max_sentences` (a shard of a distributed run);
    sentence i is seeded `seed + i` either way, so a shard records what the whole run records.
    `pipe`: a `recording_pipeline(fp32_dir)` to record with (reused by callers that record often)."""
    st = settings
    pipe = pipe if pipe is not None else recording_pipeline(fp32_dir, st.threads)
    trajs: list[Trajectory] = []
    current: dict[str, Any] = {}

    def on_run(component: str, feeds: dict[str, Any], names: list[str], outs: list[Any]) -> None:
        t: Trajectory = current["traj"]
        if component == GPT:
            call = len(t.step_feeds)
            t.step_feeds.append({k: np.array(feeds[k]) for k in ("inputs_embeds", "attention_mask", "position_ids")})
            t.hidden.append(np.array(outs[0][:, -1]))
            if call in FULL_SAMPLE_STEPS:
                t.full_samples.append({k: np.array(v) for k, v in feeds.items()})
        elif component == HEAD_CODE:
            t.logits.append(np.array(outs[0]))

    recording = instrument(pipe, on_run, (GPT, HEAD_CODE))
    sentences = corpus.sentences[:st.max_sentences]
    chosen = list(range(len(sentences))) if indices is None else [i for i in indices if i < len(sentences)]
    for i in track(chosen, "fidelity: fp32 run", "sent", enabled=st.progress):
        text = sentences[i]
        current["traj"] = Trajectory(text)
        try:
            with quiet_logger():
                pipe.synthesize(text, synth_params(pipe, st.seed + i, st.max_new_token))
        except ForgeError as e:
            log.info("fidelity: skipped %r (%s)", text, e)
            continue
        t = current["traj"]
        if len(t.logits) != len(t.step_feeds):
            raise ForgeError("the runtime's gpt and head_code calls do not pair up; cannot teacher-force")
        trajs.append(t)
    check_recorded(recording, GPT)
    recording.remove()
    if not trajs and indices is None:
        raise ForgeError(f"no sentence of corpus '{corpus.name}' could be synthesized for fidelity")
    return trajs


# ---- the FP32 runs as a file: evaluate-reference writes it once per build, quantize and evaluate read it --

FP32_RUNS_SCHEMA = "chattts-forge/fp32-runs/1"


def fp32_runs_settings(fp32_dir: Path, corpus: Corpus, max_sentences: int, max_new_token: int,
                       seed: int) -> dict[str, Any]:
    """What recorded FP32 runs depend on: the FP32 GPT and code head, the sentences, steps and seed."""
    meta = ArtifactMeta.load(fp32_dir)
    texts = corpus.sentences[:max_sentences]
    return {"gpt_sha256": meta.component(GPT).get("sha256"), "head_sha256": meta.component(HEAD_CODE).get("sha256"),
            "sentences_sha256": hashlib.sha256("\n".join(texts).encode("utf-8")).hexdigest(),
            "sentences": len(texts), "max_new_token": max_new_token, "seed": seed}


def trajectory_arrays(trajectories: list[Trajectory], settings: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Recorded FP32 trajectories as npz arrays, with their JSON index (and `settings`) under ``index``."""
    arrays: dict[str, np.ndarray] = {}
    index = []
    for i, t in enumerate(trajectories):
        for j, feeds in enumerate(t.step_feeds):
            arrays |= {f"t{i}.feed{j}.{name}": v for name, v in feeds.items()}
        for j, (h, lg) in enumerate(zip(t.hidden, t.logits, strict=True)):
            arrays[f"t{i}.hidden{j}"], arrays[f"t{i}.logits{j}"] = h, lg
        for j, sample in enumerate(t.full_samples):
            arrays |= {f"t{i}.full{j}.{name}": v for name, v in sample.items()}
        index.append({"text": t.text, "feeds": [list(f) for f in t.step_feeds], "steps": len(t.hidden),
                      "full": [list(s) for s in t.full_samples]})
    head = {"schema": FP32_RUNS_SCHEMA, "settings": settings, "trajectories": index}
    arrays["index"] = np.frombuffer(json.dumps(head, sort_keys=True).encode(), dtype=np.uint8)
    return arrays


def trajectories_from(z: Any, index: list[dict[str, Any]]) -> list[Trajectory]:
    out = []
    for i, rec in enumerate(index):
        out.append(Trajectory(
            text=rec["text"],
            step_feeds=[{name: z[f"t{i}.feed{j}.{name}"] for name in names} for j, names in enumerate(rec["feeds"])],
            hidden=[z[f"t{i}.hidden{j}"] for j in range(rec["steps"])],
            logits=[z[f"t{i}.logits{j}"] for j in range(rec["steps"])],
            full_samples=[{name: z[f"t{i}.full{j}.{name}"] for name in names} for j, names in enumerate(rec["full"])],
        ))
    return out


def read_fp32_runs(path: Path, settings: dict[str, Any]) -> list[Trajectory] | None:
    """The trajectories in `path` when they were recorded with `settings`; None (logged) otherwise."""
    try:
        with np.load(path, allow_pickle=False) as z:
            head = json.loads(bytes(z["index"]).decode("utf-8"))
            if head.get("schema") != FP32_RUNS_SCHEMA or head.get("settings") != settings:
                theirs = head.get("settings") or {}
                differ = sorted(k for k in set(settings) | set(theirs) if settings.get(k) != theirs.get(k))
                log.info("fidelity: %s holds FP32 runs of other settings (%s); recording them here", path,
                         ", ".join(differ) or "schema")
                return None
            trajs = trajectories_from(z, head["trajectories"])
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as e:
        raise BadInput(f"FP32 runs {path} are unreadable ({type(e).__name__}: {e})") from None
    log.info("fidelity: the FP32 runs of %d sentences read from %s (recorded once for the build)", len(trajs), path)
    return trajs


def recording_pipeline(fp32_dir: Path, threads: int | None) -> Any:
    """The pipeline FP32 runs are recorded with: the plain graph, as fidelity always recorded (the fused
    graph's hidden states differ by ~1e-6)."""
    return new_pipeline(fp32_dir, threads, engine="plain")


def make_session(path: Path, threads: int | None = 1) -> Any:
    # onnxruntime: only once a session is made here; 0.06 s to import
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.inter_op_num_threads = 1
    if threads:
        opts.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise ForgeError(f"cannot load {path}: {str(e).splitlines()[0]}") from None


def replay(step: GptStepLike, head: Any, traj: Trajectory) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Teacher-forced run of a runtime GPT step (with its own KV cache) and the code head on a
    trajectory's recorded inputs: each step sees the FP32 code history."""
    step.reset(traj.step_feeds[0]["inputs_embeds"].shape[0])
    hidden, logits = [], []
    for feeds in traj.step_feeds:
        h = np.ascontiguousarray(step(feeds["inputs_embeds"], feeds["attention_mask"], feeds["position_ids"])[:, -1])
        hidden.append(h)
        logits.append(head.run(["logits"], {"hidden_states": h})[0])
    return hidden, logits


def plain_step(gpt: Any, dims: Dims) -> GptStep:
    """The runtime's plain GPT step on a `gpt.onnx` session (checked for its past key/value inputs)."""
    if "past_key_values.0.key" not in {i.name for i in gpt.get_inputs()}:
        raise ForgeError("the gpt graph has no past_key_values inputs (docs/artifact-format.md)")
    return GptStep(gpt, dims)


def fast_step(quant_dir: Path, threads: int | None, quant_meta: ArtifactMeta | None = None) -> GptStepLike:
    """The artifact's fused `gpt_fast` graph driven by the runtime's own fast step (its in-place KV
    cache), so the graph the runtime prefers is measured too. `quant_meta`: the folder's
    artifact.json when it is not written yet (the quantize stage)."""
    return open_gpt_step(LoadedArtifact(quant_dir, threads=threads, verify="none", meta=quant_meta), "fast")


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def code_metrics(ref_logits: list[np.ndarray], q_logits: list[np.ndarray]) -> dict[str, Any]:
    """Top-1 agreement and KL per stream over all steps/rows. Logits [B, vq, V] per step."""
    ref = np.concatenate([r.reshape(-1, *r.shape[-2:]) for r in ref_logits])  # [N, vq, V]
    q = np.concatenate([x.reshape(-1, *x.shape[-2:]) for x in q_logits])
    agree = (ref.argmax(-1) == q.argmax(-1)).mean(axis=0)
    lp, lq = _log_softmax(ref), _log_softmax(q)
    kl = (np.exp(lp) * (lp - lq)).sum(-1).mean(axis=0)
    return {
        "top1_agreement": {"mean": float(agree.mean()), "min_stream": float(agree.min()),
                           "per_stream": [round(float(a), 6) for a in agree]},
        "kl": {"mean": float(kl.mean()), "max_stream": float(kl.max()), "per_stream": [float(k) for k in kl]},
        "steps": int(ref.shape[0]),
    }


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(1) / np.maximum(den, 1e-30)


def mel_metrics(ref_mels: list[np.ndarray], q_mels: list[np.ndarray]) -> dict[str, float]:
    ref = np.concatenate([m.reshape(m.shape[-2], -1) for m in ref_mels], axis=1).astype(np.float64)
    q = np.concatenate([m.reshape(m.shape[-2], -1) for m in q_mels], axis=1).astype(np.float64)
    noise = ((ref - q) ** 2).sum()
    snr = float("inf") if noise == 0 else float(10 * np.log10((ref**2).sum() / noise))
    lsd = float(np.sqrt((((ref - q) * _DB_PER_NAT) ** 2).mean(axis=0)).mean())
    return {"snr_db": snr, "lsd_db": lsd, "frames": int(ref.shape[1])}


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def _expose(model_path: Path, names: list[str], out_path: Path) -> list[str]:
    """Copy of the model with `names` (those it has) added as float graph outputs."""
    model = onnx.load(str(model_path))
    have = {o for n in model.graph.node for o in n.output}
    existing = {o.name for o in model.graph.output}
    added = []
    for name in names:
        if name in have and name not in existing:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
            added.append(name)
    onnx.save(model, str(out_path))
    return added


def _exposed_session(path: Path, role: str, threads: int | None) -> Any:
    """A session over a temporary exposed copy; its error names the graph, not the temporary folder
    (the message is recorded in reports, which travel)."""
    try:
        return make_session(path, threads)
    except ForgeError as e:
        reason = str(e).replace(f"cannot load {path}: ", "").replace(str(path.parent) + os.sep, "")
        raise ForgeError(f"the {role} gpt graph with its MatMul tensors exposed cannot be loaded: {reason}") from None


def tensor_errors(
    ref_gpt: Path, quant_gpt: Path, samples: list[dict[str, np.ndarray]], threads: int | None = 1
) -> list[dict[str, Any]]:
    """Per-tensor relative error of every constant-weight MatMul's input/output (see module docstring).

    Rows sorted by the error each node adds (`local_error`), worst first.
    """
    ref_model = onnx.load(str(ref_gpt), load_external_data=False)
    prod = _producers(ref_model)
    by_name = {n.name: n for n in ref_model.graph.node}
    nodes = [by_name[n] for n in matmul_nodes_with_const_weight(ref_model)]
    wanted = sorted({t for n in nodes for t in (n.input[0], n.output[0])})
    # The FP32 artifact judged against itself: one graph, so one exposed copy and one session (its
    # runs are the same numbers twice; every tensor's error is exactly 0)
    same = Path(ref_gpt).resolve() == Path(quant_gpt).resolve()
    with tempfile.TemporaryDirectory(prefix="forge-tensors-") as tmp:
        ref_aug, q_aug = Path(tmp) / "ref.onnx", Path(tmp) / "q.onnx"
        exposed = set(_expose(ref_gpt, wanted, ref_aug))
        common = exposed if same else exposed & set(_expose(quant_gpt, wanted, q_aug))
        ref_s = _exposed_session(ref_aug, "FP32", threads)
        q_s = ref_s if same else _exposed_session(q_aug, "quantized", threads)
        names = sorted(common)
        num = dict.fromkeys(names, 0.0)
        den = dict.fromkeys(names, 0.0)
        dot = dict.fromkeys(names, 0.0)
        qq = dict.fromkeys(names, 0.0)
        for feeds in samples:
            r_out = ref_s.run(names, feeds)
            q_out = r_out if same else q_s.run(names, feeds)
            for n, r, q in zip(names, r_out, q_out, strict=True):
                r64, q64 = r.astype(np.float64).ravel(), q.astype(np.float64).ravel()
                num[n] += float(((r64 - q64) ** 2).sum())
                den[n] += float((r64**2).sum())
                dot[n] += float((r64 * q64).sum())
                qq[n] += float((q64**2).sum())
    rel = {n: float(np.sqrt(num[n] / max(den[n], 1e-30))) for n in names}
    cos = {n: float(dot[n] / max(np.sqrt(den[n] * qq[n]), 1e-30)) for n in names}
    rows = []
    for node in nodes:
        out, inp = node.output[0], node.input[0]
        if out not in rel:
            continue
        in_err = rel.get(inp, 0.0)
        rows.append(
            {
                "node": node.name,
                "op_type": node.op_type,
                "tensor": out,
                "rel_error": round(rel[out], 6),
                "cosine": round(cos[out], 6),
                "input_rel_error": round(in_err, 6),
                "local_error": round(rel[out] - in_err, 6),
                "producer_of_input": prod[inp].name if inp in prod else inp,
            }
        )
    rows.sort(key=lambda r: r["local_error"], reverse=True)
    return rows


def head_error(ref_head: Path, q_head: Path, trajs: list[Trajectory], threads: int | None = 1) -> float:
    """Relative error of the quantized code head alone, on the FP32 hidden states."""
    hidden = np.concatenate([h for t in trajs for h in t.hidden])[:512]
    r = make_session(ref_head, threads).run(["logits"], {"hidden_states": hidden})[0]
    q = make_session(q_head, threads).run(["logits"], {"hidden_states": hidden})[0]
    return float(np.linalg.norm(r - q) / max(np.linalg.norm(r), 1e-30))


@dataclass
class SentenceComparison:
    """One trajectory replayed through the quantized graphs: what the corpus-level figures are made of."""

    ref_logits: list[np.ndarray]
    q_logits: list[np.ndarray]
    cosine: np.ndarray  # hidden-state cosine per (row, step)
    ref_mel: np.ndarray
    q_mel: np.ndarray
    fast_logits: list[np.ndarray] | None = None  # the fused gpt_fast graph, when the artifact has one
    fast_cosine: np.ndarray | None = None
    fast_error: str | None = None


class ReplaySessions:
    """The quantized GPT/head/decoder and the FP32 decoder, loaded once, to compare trajectories with."""

    def __init__(self, fp32_dir: str | os.PathLike[str], quant_dir: str | os.PathLike[str],
                 threads: int | None = None, quant_meta: ArtifactMeta | None = None) -> None:
        self.fp32_dir, self.quant_dir = Path(fp32_dir), Path(quant_dir)
        self.threads, self.quant_meta = threads, quant_meta
        self.fmeta = ArtifactMeta.load(self.fp32_dir)
        self.qmeta = quant_meta if quant_meta is not None else ArtifactMeta.load(self.quant_dir)
        self.q_gpt_path = self.qmeta.component_file(self.quant_dir, GPT)
        self.q_head_path = self.qmeta.component_file(self.quant_dir, HEAD_CODE)
        q_gpt, self.q_head = make_session(self.q_gpt_path, threads), make_session(self.q_head_path, threads)
        self.f_dec = make_session(self.fmeta.component_file(self.fp32_dir, DECODER), threads)
        self.q_dec = make_session(self.qmeta.component_file(self.quant_dir, DECODER), threads)
        self.q_step = plain_step(q_gpt, self.fmeta.require_dims())
        # The FP32 artifact judged against itself (the build's fp32 evaluation): its plain GPT, head and
        # Decoder are the very files the trajectories were recorded with, so their replay is the
        # recording itself; only the fused graph (another graph) is replayed
        self.same_plain = all(self.qmeta.component_file(self.quant_dir, c).resolve()
                              == self.fmeta.component_file(self.fp32_dir, c).resolve()
                              for c in (GPT, HEAD_CODE, DECODER))
        self.has_fast = self.qmeta.has_component(FAST_GPT)
        self._fast: GptStepLike | None = None  # the fused graph's step, opened on first use and kept

    def fast(self) -> GptStepLike:
        """The quantized fused graph's step, one session for every trajectory (each replay resets it)."""
        if self._fast is None:
            self._fast = fast_step(self.quant_dir, self.threads, self.quant_meta)
        return self._fast

    def compare(self, t: Trajectory) -> SentenceComparison:
        hidden, logits = (list(t.hidden), list(t.logits)) if self.same_plain else replay(self.q_step, self.q_head, t)
        ref_h, q_h = np.stack(t.hidden, axis=-1), np.stack(hidden, axis=-1)  # [B, H, T]
        ref_mel = self.f_dec.run(["mel"], {"hidden_states": ref_h.astype(np.float32)})[0]
        cmp = SentenceComparison(
            ref_logits=list(t.logits), q_logits=logits,
            cosine=cosine_rows(np.moveaxis(ref_h, -1, 1), np.moveaxis(q_h, -1, 1)),
            ref_mel=ref_mel,
            q_mel=ref_mel if self.same_plain else self.q_dec.run(["mel"], {"hidden_states": q_h.astype(np.float32)})[0],
        )
        if self.has_fast:
            try:
                f_hidden, cmp.fast_logits = replay(self.fast(), self.q_head, t)
                cmp.fast_cosine = cosine_rows(np.stack(t.hidden, 1), np.stack(f_hidden, 1))
            except (ImportError, ForgeError) as e:
                cmp.fast_error = f"could not replay {FAST_GPT}: {e}"
        return cmp

    def tensor_table(self, trajectories: list[Trajectory], top_tensors: int,
                     keep_all_tensors: bool) -> dict[str, Any]:
        """The per-tensor error table on the first recorded whole-graph samples (see tensor_errors)."""
        samples = [s for t in trajectories for s in t.full_samples][:4]
        rows = tensor_errors(self.fmeta.component_file(self.fp32_dir, GPT), self.q_gpt_path, samples, self.threads)
        worst_abs = sorted(rows, key=lambda r: r["rel_error"], reverse=True)
        return {
            "graph": GPT,
            "samples": len(samples),
            "tensors_compared": len(rows),
            "worst_local": rows[:top_tensors],
            "worst_output": [{k: r[k] for k in ("node", "rel_error", "cosine")} for r in worst_abs[:top_tensors]],
            "all_local": rows if keep_all_tensors else None,
            "head_code_rel_error": head_error(self.fmeta.component_file(self.fp32_dir, HEAD_CODE),
                                              self.q_head_path, trajectories, self.threads),
        }


def summarize_fidelity(fp32_dir: Path, corp: Corpus, comparisons: list[SentenceComparison],
                       settings: dict[str, Any]) -> dict[str, Any]:
    """The corpus-level fidelity record from per-sentence comparisons, in corpus order (a distributed
    run merges its shards' comparisons in corpus order and gets the same figures)."""
    ref_logits = [x for c in comparisons for x in c.ref_logits]
    cos = np.concatenate([c.cosine for c in comparisons])
    result: dict[str, Any] = {
        "reference": str(fp32_dir),
        "corpus": {"name": corp.name, "sha256": corp.sha256, "sentences_used": len(comparisons)},
        "method": "teacher-forced replay of FP32 runtime trajectories (raw code logits)",
        "settings": settings,
        "teacher_forced": code_metrics(ref_logits, [x for c in comparisons for x in c.q_logits]),
        "hidden_cosine": {"mean": float(cos.mean()), "min": float(cos.min())},
        "mel": mel_metrics([c.ref_mel for c in comparisons], [c.q_mel for c in comparisons]),
    }
    errors = [c.fast_error for c in comparisons if c.fast_error]
    if errors:
        result[FAST_GPT] = {"error": errors[0]}
    elif comparisons and comparisons[0].fast_logits is not None:
        f_cos = np.concatenate([c.fast_cosine for c in comparisons if c.fast_cosine is not None])
        result[FAST_GPT] = {
            "teacher_forced": code_metrics(ref_logits, [x for c in comparisons for x in c.fast_logits or []]),
            "hidden_cosine": {"mean": float(f_cos.mean()), "min": float(f_cos.min())}}
    return Fidelity.from_dict(result).to_dict()  # the record's one shape (artifact.Fidelity)


def measure_fidelity(
    fp32_dir: str | os.PathLike[str],
    quant_dir: str | os.PathLike[str],
    corpus: str | os.PathLike[str] | Corpus = "builtin:evaluation",
    settings: FidelitySettings | None = None,
    *,
    trajectories: list[Trajectory] | None = None,
    quant_meta: ArtifactMeta | None = None,
    sessions: ReplaySessions | None = None,
    recorder: Any = None,
    **options: Any,
) -> dict[str, Any]:
    """Fidelity of the artifact at `quant_dir` vs `fp32_dir`; the schema is in `chattts_forge.quantize`
    (`artifact.Fidelity`). `options` (FidelitySettings' fields) are the shorthand for `settings`.

    `trajectories`: the FP32 runs to replay, when already recorded; `quant_meta`: the artifact.json of
    `quant_dir` when it is not written yet (the quantize stage measures before it writes the
    description once). `sessions` and `recorder` (`recording_pipeline`): opened by a caller that
    measures several times on the same pair (evaluate's length buckets), so they are loaded once."""
    st = dataclasses.replace(settings or FidelitySettings(), **options)
    fp32_dir, quant_dir = Path(fp32_dir), Path(quant_dir)
    corp = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
    sessions = sessions if sessions is not None else ReplaySessions(fp32_dir, quant_dir, st.threads, quant_meta)
    if trajectories is None:
        trajectories = record_trajectories(fp32_dir, corp, st, pipe=recorder)
    compared = [sessions.compare(t) for t in track(trajectories, "fidelity: replay", "sent", enabled=st.progress)]
    result = summarize_fidelity(fp32_dir, corp, compared,
                                {"max_sentences": st.max_sentences, "max_new_token": st.max_new_token, "seed": st.seed})
    if st.per_tensor:
        result["per_tensor"] = sessions.tensor_table(trajectories, st.top_tensors, st.keep_all_tensors)
    return result


def summary_line(fid: dict[str, Any]) -> str:
    tf = fid["teacher_forced"]
    return (
        f"top-1 agreement {tf['top1_agreement']['mean']:.4f} (min stream {tf['top1_agreement']['min_stream']:.4f}), "
        f"KL {tf['kl']['mean']:.2e}, hidden cosine {fid['hidden_cosine']['mean']:.5f}, "
        f"mel SNR {fid['mel']['snr_db']:.1f} dB, LSD {fid['mel']['lsd_db']:.3f} dB"
    )
