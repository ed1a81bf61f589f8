"""The cache measure_cache_effect makes from its misses vs build_phrase_cache's file: same bytes?"""
import sys, tempfile
from pathlib import Path
from chattts_forge.calibration_data.phrases import shipped_phrases
from chattts_forge.runtime import InferCodeParams, Pipeline, SynthParams
from chattts_forge.runtime.phrase_cache import build_phrase_cache, cache_knobs, cached_phrase, payload_sha256, write_cache
art, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
phrases = shipped_phrases()[:n]
plain = Pipeline(art, threads=2)
params = SynthParams(code=InferCodeParams(spk_emb=plain.random_speaker(0), seed=0, max_new_token=steps))
with tempfile.TemporaryDirectory() as tmp:
    lst = Path(tmp) / "p.txt"; lst.write_text("\n".join(phrases) + "\n", encoding="utf-8")
    built = build_phrase_cache(art, lst, Path(tmp) / "a.cache", params, threads=2)
    misses = [plain.synthesize(t, params)[0] for t in phrases]
    v, pay = str(plain.artifact.variant), payload_sha256(art)
    entries = {}
    for t, a in zip(phrases, misses):
        norm = plain.normalize(t, params)
        entries.setdefault(norm, (norm, v, pay, cached_phrase(plain, norm, a.text, a.codes, a.hiddens, params.use_decoder)))
    write_cache(Path(tmp) / "b.cache", cache_knobs(params, plain.num_vq), {v: pay}, list(entries.values()))
    print("same bytes:", (Path(tmp) / "a.cache").read_bytes() == (Path(tmp) / "b.cache").read_bytes(), built["phrases"], len(entries))
