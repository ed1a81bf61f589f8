"""Up-front checks of what `quantize` reads: the FP32 source artifact and the calibration folder.

Both run before any work, so a damaged input is named in one line instead of being discovered by
onnxruntime (or the fidelity step) minutes later, and nothing is written.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from chattts_forge.artifact import FAST_GPT, GPT, ArtifactMeta
from chattts_forge.calibration_data.store import CalibrationStore
from chattts_forge.errors import BadInput, ForgeError, IntegrityError
from chattts_forge.integrity import sha256_file, verify_files


def check_input_artifact(src: Path, meta: ArtifactMeta) -> None:
    """Every component file recorded in artifact.json exists with its recorded size and sha256."""
    for name in meta.components:
        meta.component_file(src, name)  # a missing graph is a one-line error naming the component
    problems = verify_files(src, meta, components=tuple(meta.components)).mismatches
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise IntegrityError(f"input artifact {src}: {problems[0].describe()}{more} (damaged or replaced; re-run convert)")


def open_calibration(calibration: str | Path, src: Path, meta: ArtifactMeta,
                     components: tuple[str, ...] = (GPT,)) -> CalibrationStore:
    """The calibration folder, checked: recorded from this artifact, samples for `components`, and
    every shard readable to its end (a truncated .npz fails its zip check here, not mid-run)."""
    store = CalibrationStore(calibration)
    recorded = (store.manifest.get("artifact") or {}).get("gpt_sha256")
    current = meta.component(GPT).get("sha256") or sha256_file(meta.component_file(src, GPT))
    if not recorded:
        raise IntegrityError(f"calibration {calibration}: its manifest names no source artifact (gpt sha256); "
                         "re-run `chattts-forge calibrate`")
    if recorded != current:
        raise IntegrityError(f"calibration {calibration} was recorded from a different artifact (gpt sha256 differs)")
    for c in components:
        if store.count(c) == 0:
            raise BadInput(f"calibration {calibration} has no {c} samples (empty; re-run `calibrate`)")
        for rel in store.manifest["components"][c].get("shards", []):
            try:
                with zipfile.ZipFile(store.path / rel) as z:
                    bad = z.testzip()
            except (OSError, zipfile.BadZipFile) as e:
                raise BadInput(f"calibration shard {store.path / rel} is unreadable ({e}); re-run `calibrate`") from None
            if bad is not None:
                raise IntegrityError(f"calibration shard {store.path / rel} is corrupt ({bad}); re-run `calibrate`")
    _ = store.statistics  # read now: unreadable statistics are a one-line error before any work
    return store


def check_statistics_graph(store: CalibrationStore, graph: str, meta: ArtifactMeta, src: Path) -> None:
    """The statistics of `graph` were observed on this source's own file (its sha256), so every
    tensor name means the same activation."""
    component = FAST_GPT if graph == FAST_GPT else graph
    recorded = store.statistics.graph_sha256.get(graph)
    if recorded is None:
        raise ForgeError(f"calibration {store.path} has no statistics of {graph} (re-run `chattts-forge calibrate`)")
    current = meta.component(component).get("sha256") or sha256_file(meta.component_file(src, component))
    if recorded != current:
        raise IntegrityError(f"calibration {store.path}: its {graph} statistics were observed on another graph "
                         "(sha256 differs; recorded from another artifact?)")
