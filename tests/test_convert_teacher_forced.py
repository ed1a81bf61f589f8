"""The exported FP32 graphs (embed -> gpt with KV cache -> head_code) against ChatTTS's generate loop.

ChatTTS runs its own `_infer_code` (temperature 1e-9, EOS masked by min_new_token, no repetition
penalty so that its choice is the plain argmax of the head logits; top-p/top-k keep the top token).
1. Teacher forcing: fed ChatTTS's own codes, the graphs reproduce its per-step code logits within
   1e-4 for every one of >= 100 steps, for a left-padded batch of two prompts.
2. Argmax generation through the graphs gives ChatTTS's codes; a divergence is admissible only at
   a near-tie (ChatTTS's top-2 gap < 1e-5), which the test reports.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

TEXTS = ["你好，今天的天气非常好，我们一起出去走走吧。", "早上好。"]
STEPS = 110
TOLERANCE = 1e-4


def _session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


class GraphStepper:
    """The code-generation loop over the exported graphs, as ChatTTS's GPT.generate runs it."""

    def __init__(self, folder: Path, prompt_ids: np.ndarray, prompt_mask: np.ndarray) -> None:
        import json

        doc = json.loads((folder / "artifact.json").read_text())
        self.dims = doc["dims"]
        self.num_vq = self.dims["num_vq"]
        self.layers = self.dims["num_hidden_layers"]
        self.embed = _session(folder / "embed.onnx")
        self.gpt = _session(folder / "gpt.onnx")
        self.head = _session(folder / "head_code.onnx")
        batch = prompt_ids.shape[0]
        head_dim = self.dims["hidden_size"] // self.dims["num_attention_heads"]
        empty = np.zeros((batch, self.dims["num_key_value_heads"], 0, head_dim), np.float32)
        self.past = [empty] * (2 * self.layers)
        self.mask = prompt_mask.astype(np.int64)
        ids = np.repeat(prompt_ids[..., None], self.num_vq, -1).astype(np.int64)
        self.logits = self._forward(ids, np.ones(prompt_ids.shape, dtype=bool))

    def _forward(self, ids: np.ndarray, text_mask: np.ndarray) -> np.ndarray:
        (emb,) = self.embed.run(None, {"input_ids": ids, "text_mask": text_mask})
        seq = emb.shape[1]
        pos = np.cumsum(self.mask, -1) - 1
        pos[self.mask == 0] = 1
        feed = {
            "inputs_embeds": emb,
            "attention_mask": self.mask,
            "position_ids": pos[:, -seq:].astype(np.int64),
        }
        for i in range(self.layers):
            feed[f"past_key_values.{i}.key"] = self.past[2 * i]
            feed[f"past_key_values.{i}.value"] = self.past[2 * i + 1]
        out = self.gpt.run(None, feed)
        self.past = out[1:]
        (logits,) = self.head.run(None, {"hidden_states": out[0][:, -1]})
        return logits  # [B, num_vq, V]

    def feed_codes(self, codes: np.ndarray) -> np.ndarray:
        """Append one step of codes [B, num_vq]; returns the next step's logits."""
        self.mask = np.concatenate([self.mask, np.ones((self.mask.shape[0], 1), np.int64)], 1)
        self.logits = self._forward(codes[:, None, :].astype(np.int64), np.zeros((codes.shape[0], 1), bool))
        return self.logits


@pytest.fixture(scope="module")
def chattts_run(tiny_chat):
    from chattts_forge.torch_ref import oracle

    run = oracle.chattts_codes(
        tiny_chat, TEXTS, max_new_token=STEPS, min_new_token=STEPS, temperature=1e-9, repetition_penalty=None
    )
    assert all(len(c) == STEPS for c in run["codes"]), [len(c) for c in run["codes"]]
    assert run["attention_mask"].min() == 0, "the prompts should need left padding"
    return run


def test_teacher_forced_logits_match_chattts(tiny_artifacts, chattts_run):
    codes = np.stack(chattts_run["codes"])  # [B, STEPS, num_vq]
    raw = np.stack(chattts_run["raw_logits"])  # [B, STEPS, num_vq, V]
    stepper = GraphStepper(tiny_artifacts["fp32"], chattts_run["input_ids"], chattts_run["attention_mask"])
    errors = []
    logits = stepper.logits
    for i in range(STEPS):
        errors.append(float(np.abs(logits - raw[:, i]).max()))
        if i + 1 < STEPS:
            logits = stepper.feed_codes(codes[:, i])
    print(f"teacher-forced: {STEPS} steps, max abs logit error {max(errors):.3g}")
    assert len(errors) >= 100
    assert max(errors) <= TOLERANCE, f"step {int(np.argmax(errors))}: {max(errors):.3g}"


def test_argmax_generation_matches_chattts_codes(tiny_artifacts, chattts_run, record_property):
    from chattts_forge.torch_ref.oracle import NEAR_TIE

    want = chattts_run["codes"]
    gaps = chattts_run["top2_gap"]
    eos = chattts_run["params"]["eos"]
    batch = len(want)
    stepper = GraphStepper(tiny_artifacts["fp32"], chattts_run["input_ids"], chattts_run["attention_mask"])
    diverged: dict[int, tuple[int, float]] = {}
    matched = np.zeros(batch, dtype=int)
    logits = stepper.logits
    for i in range(STEPS):
        masked = logits.copy()
        masked[..., eos] = -np.inf  # EOS masked, as min_new_token does in ChatTTS
        ours = masked.argmax(-1)  # [B, num_vq]
        for b in range(batch):
            if b in diverged:
                continue
            if np.array_equal(ours[b], want[b][i]):
                matched[b] += 1
                continue
            vq = np.nonzero(ours[b] != want[b][i])[0]
            gap = float(gaps[b][i][vq].max())
            assert gap < NEAR_TIE, (
                f"row {b} step {i}: graphs chose {ours[b].tolist()}, ChatTTS {want[b][i].tolist()} "
                f"with a top-2 gap of {gap:.3g} (not a near-tie)"
            )
            diverged[b] = (i, gap)
        logits = stepper.feed_codes(ours)
    for b, (step, gap) in diverged.items():
        msg = f"near-tie divergence: row {b} at step {step} (ChatTTS top-2 gap {gap:.3g} < {NEAR_TIE})"
        warnings.warn(msg, stacklevel=1)
        record_property(f"near_tie_row{b}", msg)
    print(
        f"argmax generation: codes equal ChatTTS's for {matched.tolist()} of {STEPS} steps; ties: {diverged}"
    )
    for b in range(batch):
        if b not in diverged:
            assert matched[b] == STEPS
