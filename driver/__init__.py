"""The build driver: runs every stage, incrementally and kill-safe, then publishes (`make artifacts`).

It sits on top of the import order (core -> runtime -> calibration -> quantize -> evaluate ->
publish -> driver): it runs each stage as a `chattts-forge` subprocess and publishes in-process.

- `chattts-forge build [--preset full|tiny] ...` (chattts_forge.driver.cli; `python -m
  chattts_forge.driver` is the same command).
- `run_pipeline(...)` -> list of `VariantOutcome` (chattts_forge.driver.pipeline: the run loop; its
  docstring tells the whole story; `config`, `records`, `lock`, `publishing`, `summary` hold the parts).
- Each step is keyed on its inputs and on the import closure of the code it runs, computed from the
  source by chattts_forge.codegraph (see driver/pipeline.py's docstring).
"""

from chattts_forge.driver.pipeline import VariantOutcome, run_pipeline

__all__ = ["VariantOutcome", "run_pipeline"]
