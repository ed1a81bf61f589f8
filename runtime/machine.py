"""Where a measurement ran: the CPU's model and SIMD flags, cores, memory, threads, providers,
platform, library versions (`machine_info`). The one place that reads them: reports, bench,
autotune's and the cost model's cache keys all ask here."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from chattts_forge.runtime.providers import EXECUTION_PROVIDERS

# CPU features that decide which kernels onnxruntime runs (x86 /proc/cpuinfo flag names).
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; the platform's processor elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The SIMD features of this CPU that matter to onnxruntime's kernels (x86 Linux; [] elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return [f for f in SIMD_FLAGS if f in have]
    except OSError:
        pass
    return []


# onnxruntime's u8 x s8 kernels add products in int32 with these (VPDPBUSD, AMX); without them
# (VPMADDUBSW) two products share a saturating int16, which full-range (8-bit) weights overflow.
UNSATURATED_U8S8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def u8s8_saturates() -> bool:
    """Whether this CPU's u8s8 INT8 kernels saturate 8-bit weights (x86 without VNNI/AMX)."""
    flags = cpu_flags()
    return bool(flags) and "avx2" in flags and not any(f in flags for f in UNSATURATED_U8S8_FLAGS)


def machine_info(threads: int | None, provider: str = "cpu") -> dict[str, Any]:
    """Where a measurement ran: CPU, cores, memory, threads, the onnxruntime provider the runtime used
    (`cpu` or `cuda`, resolved) and those available, platform, load, library versions and the
    toolchain's commit."""
    # onnxruntime (0.06 s), psutil (11 ms), versions (2.2 ms): for reports only
    import onnxruntime as ort
    import psutil

    from chattts_forge.versions import library_versions, toolchain_info

    return {
        "cpu_model": cpu_model(),
        "processor": platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count(),
        "cpu_count": os.cpu_count(),  # = logical_cores (bench's name for it)
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "threads": threads,
        "provider": EXECUTION_PROVIDERS[provider],
        "available_providers": ort.get_available_providers(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "versions": library_versions(),
        "toolchain": toolchain_info(),
    }
