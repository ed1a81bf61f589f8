"""Time loading an artifact with and without checking its files (docs/measurements/*/load-verify.md).

    python scripts/load_verify.py --artifact DIR --verify sha256|full|size|none [--cold] [--evict]
        [--public-key PUB] [--sessions]

`--cold`: forget the verified-hash cache first (every file is hashed: the first load); without it a
second load finds the cache warm. `--evict`: drop the artifact's files from the OS page cache first
(posix_fadvise DONTNEED, these files only), so hashing reads the disk. `--sessions`: also open the
sessions synthesis uses (what a first request waits for). Prints one JSON line: seconds to build the
Pipeline, the hashing seconds and what was hashed or vouched for by the cache.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def evict(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", type=Path, required=True)
    ap.add_argument("--verify", default="sha256")
    ap.add_argument("--public-key", type=Path, default=None)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--evict", action="store_true")
    ap.add_argument("--sessions", action="store_true")
    args = ap.parse_args()

    from chattts_forge.integrity import CACHE_FILE, user_cache_dir

    if args.cold:
        (user_cache_dir() / CACHE_FILE).unlink(missing_ok=True)
    if args.evict:
        evict(args.artifact)
    t0 = time.perf_counter()
    from chattts_forge.runtime.pipeline import Pipeline

    t_import = time.perf_counter()
    pipe = Pipeline(args.artifact, verify=args.verify, public_key=args.public_key)
    t_pipe = time.perf_counter()
    if args.sessions:
        _ = pipe.gpt  # the GPT engine's session
        for name in ("embed", "head_code", "decoder", "vocos"):
            pipe.artifact.session(name)
    t_sessions = time.perf_counter()
    v = pipe.artifact.verification
    print(json.dumps({
        "verify": v.mode, "public_key": str(args.public_key) if args.public_key else None, "cold": args.cold,
        "evict": args.evict, "import_s": round(t_import - t0, 4), "pipeline_s": round(t_pipe - t_import, 4),
        "check_s": round(v.seconds, 4), "hash_s": round(v.hash_seconds, 4), "hashed": len(v.hashed),
        "cached": len(v.cached), "files": len(v.files), "mb_hashed": round(v.bytes_hashed / 1e6, 1),
        "sessions_s": round(t_sessions - t_pipe, 3) if args.sessions else None,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
