"""Importing and running the runtime (library and `synth` CLI) never imports torch or ChatTTS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    import chattts_forge.runtime as rt
    from chattts_forge.cli import main

    art, out = sys.argv[1], Path(sys.argv[2])
    after_import = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
    pipe = rt.Pipeline(art, threads=1)
    params = rt.SynthParams(code=rt.InferCodeParams(seed=0, max_new_token=30), use_decoder=True)
    [res] = pipe.synthesize(["你好，世界。"], params)
    chunks = list(pipe.stream(["hello there."], params))
    pipe.refine_text(["你好"], rt.RefineTextParams(seed=0, max_new_token=4))
    pipe.decode([res.codes], use_decoder=False)
    rt.write_wav(out / "lib.wav", res.wav)
    main(["synth", "--artifact", art, "--text", "你好。", "--out", str(out / "cli.wav"), "--seed", "0",
          "--max-new-token", "20", "--speaker", "random", "--refine", "--stream"], standalone_mode=False)
    after_run = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
    print(json.dumps({"after_import": after_import, "after_run": after_run,
                      "samples": int(res.wav.size), "chunks": len(chunks)}))
    """
).replace("FORBIDDEN", "{'torch', 'torchaudio', 'ChatTTS', 'transformers', 'vocos'}")


def test_runtime_never_imports_torch(tiny_artifacts, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_artifacts["fp32"]), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["after_import"] == []
    assert report["after_run"] == []
    assert report["samples"] > 0 and report["chunks"] >= 1
    assert (tmp_path / "lib.wav").stat().st_size > 44
    assert (tmp_path / "cli.wav").stat().st_size > 44
