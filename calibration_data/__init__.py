"""calibration_data stage: our own text corpora and the `calibrate` step that records graph inputs.

- `corpus`: the versioned corpora under `corpora/vN/{calibration,evaluation}/*.txt` (held-out split
  disjoint by construction), `load_corpus(spec)` with validation, manifests.
- `calibrate`: `calibrate(artifact_dir, corpus, out_dir, CalibrateConfig(...))` runs an FP32 artifact
  over a corpus and streams the statistics quantize reads (ranges, histograms, importance, X^T X, KV
  ranges) plus a bounded raw sample of graph inputs (CLI: `calibrate`); `calibrate_config`:
  `CalibrateConfig`, the run's settings and the command's options declared once; `sentence_plan`:
  which corpus sentences a run synthesizes; `observers`: the observer sessions a run feeds.
"""

from chattts_forge.calibration_data.corpus import Corpus, load_corpus

__all__ = ["Corpus", "load_corpus"]
