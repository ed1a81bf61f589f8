"""The overload run with clients that honour Retry-After until they get through (`bench --soak`
gives up after 8 refusals, which at twice the sustainable rate loses the backlog by construction).

    python overload.py URL RATE SECONDS PHRASE_CACHE ARTIFACT OUT_PREFIX

Writes OUT_PREFIX.json and OUT_PREFIX.png as `bench --soak --rate` does; prints its summary.
"""

import sys

from chattts_forge.errors import ForgeError
from chattts_forge.evaluate.soak import SoakConfig, format_soak, run_soak

url, rate, seconds, cache, artifact, out = sys.argv[1:7]
cfg = SoakConfig(url=url, seconds=float(seconds), rate=float(rate), phrase_cache=cache, artifact=artifact,
                 retries=100_000)
try:
    report = run_soak(cfg, out + ".json", out + ".png", progress=lambda s: print(s, file=sys.stderr))
    print(format_soak(report))
except ForgeError as e:
    print(f"error: {e}")
    sys.exit(2)
