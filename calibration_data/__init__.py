"""calibration_data stage: our own text corpora and the `calibrate` step that records graph inputs.

- `corpus`: the versioned corpora under `corpora/vN/{calibration,evaluation}/*.txt` (held-out split
  disjoint by construction), `load_corpus(spec)` with validation, manifests.
- `calibrate`: `calibrate(artifact_dir, corpus, out_dir, ...)` runs an FP32 artifact over a corpus
  and records the real inputs of every quantizable graph as sharded .npz files (CLI: `calibrate`).
"""

from chattts_forge.calibration_data.corpus import Corpus, load_corpus

__all__ = ["Corpus", "load_corpus"]
