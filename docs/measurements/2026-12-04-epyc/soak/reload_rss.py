"""RSS of a server process over reloads, with the retired version's heap trimmed or not.

    python reload_rss.py trim|notrim VERSION [RELOADS]

A server (uvicorn in a thread, as the tests run it) on VERSION takes 16 requests of mixed lengths at
concurrency 4, then RELOADS times: a reload of the same folder, the previous version's retirement
awaited, 16 requests again. Prints RSS (MiB) after the first round and after each reload's round.
`notrim` replaces the trim after a retirement by nothing (what serve did before): the difference is
what the trim gives back.
"""

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from rss_now import rss

from chattts_forge.runtime.serve import state as state_module
from chattts_forge.runtime.serve.config import ServeConfig
from chattts_forge.runtime.serve.server import make_server

mode, version = sys.argv[1], sys.argv[2]
reloads = int(sys.argv[3]) if len(sys.argv) > 3 else 6
if mode == "notrim":
    state_module.release_free_heap = lambda: None

cfg = ServeConfig(artifact=version, port=8899, threads=1, verify="sha256", drain_s=5, max_batch=4)
server = make_server(cfg, install_signals=False)
state = server.forge_state
threading.Thread(target=server.run, daemon=True).start()
url = "http://127.0.0.1:8899"
while True:
    try:
        if httpx.get(url + "/readyz", timeout=5).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.1)

TEXTS = ["Hi.", "Hello there, how are you today?", "你好，很高兴为您服务。",
         "The quick brown fox jumps over the lazy dog, then runs into the forest and is gone."]


def one(i: int) -> None:
    steps = 12 + 17 * (i % 7)
    r = httpx.post(url + "/v1/audio/speech", timeout=300, json={
        "model": "tts-1", "input": TEXTS[i % len(TEXTS)], "response_format": "pcm", "seed": i,
        "max_new_token": steps, "min_new_token": steps, "refine": False})
    r.raise_for_status()


def round_() -> None:
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(16)))


round_()
figures = [rss()]
for n in range(1, reloads + 1):
    r = httpx.post(url + "/admin/reload", json={"artifact": version},
                   headers={"Authorization": f"Bearer {cfg.admin_token}"}, timeout=300)
    r.raise_for_status()
    while state.retired < n:
        time.sleep(0.05)
    round_()
    figures.append(rss())
print(mode, " ".join(f"{x:.0f}" for x in figures))
server.should_exit = True
