"""Issue 16 acceptance: ChatTTS user code runs on an artifact with the import and `load` changed.

Each script below is written the way ChatTTS 0.2.5's README examples and its repository's
tests/*.py scripts use the API (the calls, arguments and the shapes they rely on: `wavs[0]` saved
with `torch.from_numpy(wav).unsqueeze(0)`, streamed chunks concatenated on axis 1, refined text
returned per input, voice cloning through `sample_audio_speaker` + `spk_smp`/`txt_smp`), keeping
only those checks that do not depend on what real weights say. The only changes from ChatTTS code
are `import chattts_forge.compat as ChatTTS` and `chat.load(source="custom", custom_path=ART)`.
Each runs in a fresh interpreter with default parameters (2048 code steps, refinement on).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HEADER = """
import sys
import chattts_forge.compat as ChatTTS
ART, OUT = sys.argv[1], sys.argv[2]
chat = ChatTTS.Chat()
chat.load(source="custom", custom_path=ART)
"""

SCRIPTS = {
    # README "Basic usage": infer a list with every default, save wavs[i] as a [1, samples] tensor
    # (the README calls torchaudio.save, which needs torchcodec here: soundfile writes the same array).
    "readme_basic": """
        import soundfile as sf
        import torch

        texts = ["今天天气很好，我们一起去公园散步吧。", "The quick brown fox jumps over the lazy dog."]
        wavs = chat.infer(texts)
        for i in range(len(wavs)):
            sf.write(f"{OUT}/basic_output{i}.wav", torch.from_numpy(wavs[i]).unsqueeze(0).numpy().T, 24000)
        assert len(wavs) >= 1 and wavs[0].ndim == 1 and len(wavs[0]) > 0
    """,
    # README "Advanced usage": a sampled speaker, custom sampling, a refine prompt; then word-level
    # control tags with skip_refine_text; then refine_text_only.
    "readme_advanced": """
        import numpy as np

        rand_spk = chat.sample_random_speaker(seed=0)
        assert isinstance(rand_spk, str)
        params_infer_code = ChatTTS.Chat.InferCodeParams(spk_emb=rand_spk, temperature=.3, top_P=0.7, top_K=20)
        params_refine_text = ChatTTS.Chat.RefineTextParams(prompt='[oral_2][laugh_0][break_6]')
        texts = ["你好，欢迎使用。", "What a nice day."]
        wavs = chat.infer(texts, params_refine_text=params_refine_text, params_infer_code=params_infer_code)
        assert all(isinstance(w, np.ndarray) and w.dtype == np.float32 and w.ndim == 1 for w in wavs)

        text = 'What is [uv_break]your favorite english food?[laugh][lbreak]'
        wavs = chat.infer(text, skip_refine_text=True, params_refine_text=params_refine_text,
                          params_infer_code=params_infer_code)
        assert len(wavs) == 1 and wavs[0].ndim == 1

        refined = chat.infer(texts, refine_text_only=True, split_text=False)
        assert isinstance(refined, list) and len(refined) == 2 and all(isinstance(t, str) for t in refined)
    """,
    # The repository's batch test: a list of texts with word-level tags, greedy-ish sampling,
    # skip_refine_text; no output may be None. One change, in every script here: the speaker is seeded (our optional
    # argument; ChatTTS's users seed torch instead). With top_K=1 the codes then follow from the
    # speaker, and an unseeded one sometimes makes random weights end the reference sentence
    # (split_text's speaker sample) after a step or two: too short to encode, in ChatTTS as here.
    # manual_seed: ChatTTS keeps at least 3 candidates whatever top_K says (min_tokens_to_keep), so an
    # unseeded run samples; on random weights its split-text reference sentence can end after one
    # step (256 samples), too short for the DVAE encoder (one CI run in many: a one-line error).
    "batch_not_none": """
        params_infer_code = ChatTTS.Chat.InferCodeParams(
            spk_emb=chat.sample_random_speaker(seed=0), temperature=0.3, top_P=0.005, top_K=1, show_tqdm=False,
            manual_seed=0)
        texts = ["的 话 语 音 太 短 了 [uv_break] 会 造 成 错 误 。", "然 后 举 个 简 单 的 例 子 [uv_break] 。",
                 "我 使 用 seed id 去 生 成 音 频 。", "还 是 推 荐 使 用 [uv_break] 文 件 载 入 音 色 。"]
        wavs = chat.infer(texts, skip_refine_text=True, params_infer_code=params_infer_code)
        for k, wav in enumerate(wavs):
            assert wav is not None, k
    """,
    # The repository's streaming test: chunks are [texts, samples], concatenated along axis 1 and
    # converted to int16; no NaN energy anywhere.
    "stream_int16": """
        import numpy as np

        def float_to_int16(audio):
            return np.clip(audio * 32767, -32768, 32767).astype(np.int16)

        params_infer_code = ChatTTS.Chat.InferCodeParams(
            spk_emb=chat.sample_random_speaker(seed=0), temperature=0.0001, prompt="[speed_0]", show_tqdm=False)
        history = None
        for text in ["有一个神奇的故事，传说在很远很远的未来。", "有一种叫做奥特曼的物种。他是超人族的一员。"]:
            for stream_wav in chat.infer(text, skip_refine_text=True, params_infer_code=params_infer_code,
                                         stream=True):
                assert stream_wav.ndim == 2 and stream_wav.shape[0] >= 1
                history = stream_wav if history is None else np.concatenate([history[:1], stream_wav[:1]], axis=1)
                if stream_wav.shape[1]:
                    pcm = float_to_int16(stream_wav[0])
                    assert not np.isnan(np.sqrt(np.mean(np.square(pcm.astype(np.int32)))))
        assert history is not None and history.shape[1] > 0
    """,
    # Voice cloning as the README shows it: a speaker from a recording, then spk_smp + txt_smp.
    "voice_cloning": """
        import numpy as np
        import soundfile as sf

        t = np.arange(48000) / 24000
        sf.write(f"{OUT}/sample.wav", (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 24000)
        wav, sr = sf.read(f"{OUT}/sample.wav", dtype="float32")
        spk_smp = chat.sample_audio_speaker(wav)
        params_infer_code = ChatTTS.Chat.InferCodeParams(spk_smp=spk_smp, txt_smp="与样本内容完全一致的文字转录。")
        wavs = chat.infer("你好，欢迎使用。", skip_refine_text=True, params_infer_code=params_infer_code)
        assert isinstance(spk_smp, str) and wavs[0].ndim == 1
        chat.unload()
        assert not chat.has_loaded()
    """,
}
TORCH_FREE = {"batch_not_none", "stream_int16", "voice_cloning", "readme_advanced"}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_chattts_script_runs_on_compat(name: str, tiny_artifacts: dict[str, Path], tmp_path: Path) -> None:
    body = HEADER + textwrap.dedent(SCRIPTS[name])
    if name in TORCH_FREE:
        body += "\nassert not {'torch', 'ChatTTS', 'torchaudio'} & set(m.split('.')[0] for m in sys.modules)\n"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", body, str(tiny_artifacts["fp32"]), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
