"""The cache evaluate's phrase-cache section makes from its timed misses against build_phrase_cache's
file for the same phrases and request: the same bytes?

    python cache_equiv.py ARTIFACT PHRASES STEPS
"""
import sys
import tempfile
from pathlib import Path

from chattts_forge.calibration_data.phrases import shipped_phrases
from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
from chattts_forge.runtime.phrase_cache import cache_knobs, payload_sha256, write_cache
from chattts_forge.runtime.phrase_cache_build import build_phrase_cache, cached_phrase

art, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
phrases = shipped_phrases()[:n]
plain = Pipeline(art, threads=2)
params = SynthParams(code=InferCodeParams(spk_emb=plain.random_speaker(0), seed=0, max_new_token=steps))
with tempfile.TemporaryDirectory() as tmp:
    listing = Path(tmp) / "phrases.txt"
    listing.write_text("\n".join(phrases) + "\n", encoding="utf-8")
    built = build_phrase_cache(art, listing, Path(tmp) / "built.cache", params, threads=2)
    misses = [plain.synthesize(t, params)[0] for t in phrases]
    variant, payload = str(plain.artifact.variant), payload_sha256(art)
    entries = {}
    for text, miss in zip(phrases, misses, strict=True):
        norm = plain.normalize(text, params)
        entries.setdefault(norm, (norm, variant, payload,
                                  cached_phrase(plain, norm, miss.text, miss.codes, miss.hiddens, params.use_decoder)))
    write_cache(Path(tmp) / "from_misses.cache", cache_knobs(params, plain.num_vq), {variant: payload},
                list(entries.values()))
    same = (Path(tmp) / "built.cache").read_bytes() == (Path(tmp) / "from_misses.cache").read_bytes()
    print("same bytes:", same, built["phrases"], len(entries))
