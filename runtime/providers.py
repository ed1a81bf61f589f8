"""Which onnxruntime execution provider the runtime uses: `cpu`, `cuda` or `auto`.

onnxruntime lists `CUDAExecutionProvider` as available whenever the installed wheel was built with
it (onnxruntime-gpu), GPU or not; and a session asked for CUDA whose libraries or device are missing
falls back to the CPU with a logged error, not an exception. So "usable" is decided by creating a
one-node session on CUDA and reading back the providers it actually got:

- `cuda`: that probe must succeed, otherwise a one-line `ForgeError` (never a silent CPU run);
- `auto`: CUDA when the probe succeeds, else CPU, and the log says which and why;
- `cpu`: the CPU provider only.

onnxruntime-gpu 1.31 is built for CUDA 13 / cuDNN 9; the `gpu` extra installs the NVIDIA runtime
wheels and `onnxruntime.preload_dlls()` loads them from site-packages before the first CUDA session.

Never imports torch.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from functools import lru_cache

from chattts_forge.choices import Choice
from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.log import get_logger

log = get_logger(__name__)



class Provider(Choice):
    """The provider asked for: cpu, cuda (an error when no usable GPU) or auto (CUDA if usable, else CPU);
    `resolve_provider` turns it into the one that runs (cpu or cuda)."""

    CPU = "cpu"
    CUDA = "cuda"
    AUTO = "auto"


PROVIDER_CHOICES = Provider.values()
EXECUTION_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
INSTALL_HINT = "install the gpu extra in its own environment: make env GPU=1 (or pip install '.[gpu]')"


def _probe_model() -> bytes:
    """A one-node float graph (Identity), enough to make a session place a node on a provider."""
    # onnx: only when a graph is read here; 1.2 s to import
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by every onnxruntime we support
    return model.SerializeToString()


@lru_cache(maxsize=1)
def cuda_status() -> tuple[bool, str]:
    """(usable, why): whether an onnxruntime session can run on CUDA in this process."""
    # onnxruntime: only once a session is made here; 0.06 s to import
    import onnxruntime as ort

    available = ort.get_available_providers()
    if EXECUTION_PROVIDERS["cuda"] not in available:
        return False, f"this onnxruntime ({ort.__version__}) has no CUDA provider (available: {', '.join(available)})"
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        # It prints what it could not load; the probe below says whether that mattered.
        with contextlib.redirect_stdout(io.StringIO()):
            with contextlib.suppress(Exception):
                preload()
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # the CPU-fallback error is reported by the check below instead
    # A failed CUDA provider load is logged by onnxruntime's process-wide logger (several lines with
    # colour codes); the outcome is reported by the check below instead, in one line. Severity 2
    # (warnings) is onnxruntime's default, restored afterwards.
    ort.set_default_logger_severity(4)
    try:
        with warnings.catch_warnings():  # "not in available provider names": judged below instead
            warnings.simplefilter("ignore")
            session = ort.InferenceSession(_probe_model(), sess_options=opts, providers=[EXECUTION_PROVIDERS["cuda"]])
    except Exception as e:  # onnxruntime raises its own exception types
        return False, f"a CUDA session cannot be created: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    finally:
        ort.set_default_logger_severity(2)
    got = session.get_providers()
    if not got or got[0] != EXECUTION_PROVIDERS["cuda"]:
        return False, f"onnxruntime fell back to {', '.join(got)} (no CUDA device, driver or libraries)"
    return True, f"CUDA provider of onnxruntime {ort.__version__}"


def resolve_provider(requested: str) -> str:
    """`cpu` or `cuda` for a requested `cpu`/`cuda`/`auto`; ForgeError when `cuda` is not usable."""
    if requested not in PROVIDER_CHOICES:
        raise BadInput(f"unknown provider '{requested}' (choose from: {', '.join(PROVIDER_CHOICES)})")
    if requested == "cpu":
        return "cpu"
    usable, why = cuda_status()
    if requested == "cuda":
        if not usable:
            raise BadInput(f"--provider cuda: {why}; {INSTALL_HINT}, or use --provider cpu|auto")
        return "cuda"
    if usable:
        log.info("provider auto: running on CUDA (%s)", why)
        return "cuda"
    log.info("provider auto: running on CPU (%s)", why)
    return "cpu"


def session_providers(provider: str) -> list[str]:
    """onnxruntime's provider list for a resolved provider (CUDA keeps CPU for nodes it lacks)."""
    if provider == "cuda":
        return [EXECUTION_PROVIDERS["cuda"], EXECUTION_PROVIDERS["cpu"]]
    if provider == "cpu":
        return [EXECUTION_PROVIDERS["cpu"]]
    raise ForgeError(f"provider '{provider}' is not resolved (cpu or cuda)")
