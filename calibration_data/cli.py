"""`chattts-forge calibrate`: record calibration inputs of an FP32 artifact from a text corpus.

Its options are declared once, on `CalibrateConfig`'s fields (calibrate_config.py): its click
options and the words the build driver puts in its calibrate step (`option_args`) are derived from it.
"""

from __future__ import annotations

from typing import Any

import click

from chattts_forge.calibration_data.calibrate_config import CalibrateConfig
from chattts_forge.log import get_logger
from chattts_forge.options import declared_options

log = get_logger(__name__)


@click.command("calibrate")
@declared_options(CalibrateConfig)
def calibrate(**options: Any) -> None:
    """Run the FP32 artifact over a corpus and record the inputs of every quantizable graph.

    Streams statistics (activation ranges and histograms, per-channel importance, X^T X for GPTQ,
    KV-cache ranges) plus a small seeded sample of raw inputs into OUT, in bounded memory and disk, with
    a manifest (corpus, sentences by sha256 and per file, bounds) that `chattts-forge quantize
    --calibration OUT` reads.
    """
    from chattts_forge.calibration_data.calibrate import calibrate as run

    config = CalibrateConfig(**options)
    out = run(config.artifact_dir, config.corpus, config.out_dir, config)
    click.echo(str(out))
