#!/usr/bin/env python3
"""Compare text normalizers on the project's spoken-form case table (see README.md beside this file).

Candidates, each in its own virtual environment (paths given on the command line):

  wetext-auto       wetext 0.1.8, `wetext.Normalizer(lang="auto", operator="tn")` on the whole text
  spoken            the project's `chattts_forge.runtime.spoken.SPOKEN.normalize` (wetext underneath)
  nemo              nemo-text-processing `Normalizer(input_case="cased", lang=zh|en)`, grammars cached
                    as .far files in --nemo-cache (the first run compiles them)
  cn2an+num2words   cn2an.transform(text, "an2cn") on texts with CJK, else numbers -> num2words
  cn2an+inflect     the same with inflect's number_to_words for English

The language of a whole text for nemo and the cn2an pairs is picked the way wetext's `auto` does:
any CJK character -> zh, else en.

Usage (orchestrator; any Python >= 3.11, only the standard library):

  python3 compare_normalizers.py run --project /work/main --cases tests/data/spoken_cases.tsv \
      --venv wetext-auto=/tmp/nt-wetext --venv nemo=/tmp/nt-nemo \
      --venv cn2an+num2words=/tmp/nt-c2n --venv cn2an+inflect=/tmp/nt-c2i --empty-venv /tmp/nt-empty \
      --nemo-cache /tmp/nemo-cache --out /tmp/textnorm-results.json

`spoken` runs with <project>/.venv/bin/python. The worker mode (`worker CANDIDATE CASES_JSON`) is what
the orchestrator starts inside each environment; it prints one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# ---- candidates (worker side) -------------------------------------------------------------------

CJK = re.compile(r"[\u4e00-\u9fff]")

# One self-contained setup snippet per candidate: it defines `f(text) -> str`. The same snippet is
# what the cold-start command runs (with `{nemo_cache}` filled in), so it must not use this file.
SETUP = {
    "wetext-auto": (
        "from wetext import Normalizer\n_n = Normalizer(lang='auto', operator='tn')\nf = _n.normalize\n"
    ),
    "spoken": ("from chattts_forge.runtime.spoken import SPOKEN\nf = SPOKEN.normalize\n"),
    "nemo": (
        "import re, logging\n"
        "logging.disable(logging.INFO)\n"
        "from nemo_text_processing.text_normalization.normalize import Normalizer\n"
        "_cjk = re.compile(r'[\\u4e00-\\u9fff]')\n"
        "_ns = {}\n"
        "def f(t):\n"
        "    lang = 'zh' if _cjk.search(t) else 'en'\n"
        "    if lang not in _ns:\n"
        "        _ns[lang] = Normalizer(input_case='cased', lang=lang, cache_dir={nemo_cache!r})\n"
        "    return _ns[lang].normalize(t, verbose=False)\n"
    ),
    "cn2an+num2words": (
        "import re, cn2an\n"
        "from num2words import num2words\n"
        "_cjk = re.compile(r'[\\u4e00-\\u9fff]')\n"
        "def _en(m):\n"
        "    num, suf = m.group(1).replace(',', ''), m.group(2)\n"
        "    if suf:\n"
        "        return num2words(int(num), to='ordinal')\n"
        "    return num2words(float(num) if '.' in num else int(num))\n"
        "def f(t):\n"
        "    if _cjk.search(t):\n"
        "        return cn2an.transform(t, 'an2cn')\n"
        "    return re.sub(r'(\\d+(?:,\\d{3})*(?:\\.\\d+)?)(st|nd|rd|th)?', _en, t)\n"
    ),
    "cn2an+inflect": (
        "import re, cn2an, inflect\n"
        "_p = inflect.engine()\n"
        "_cjk = re.compile(r'[\\u4e00-\\u9fff]')\n"
        "def _en(m):\n"
        "    num, suf = m.group(1).replace(',', ''), m.group(2)\n"
        "    if suf:\n"
        "        return _p.number_to_words(_p.ordinal(int(num)))\n"
        "    return _p.number_to_words(num)\n"
        "def f(t):\n"
        "    if _cjk.search(t):\n"
        "        return cn2an.transform(t, 'an2cn')\n"
        "    return re.sub(r'(\\d+(?:,\\d{3})*(?:\\.\\d+)?)(st|nd|rd|th)?', _en, t)\n"
    ),
}

# The cold-start workload: import, build, and normalize one Chinese and one English sentence with digits.
COLD_ZH = "会议在2026年12月6日下午3点开始，门票99.5元。"
COLD_EN = "The meeting starts at 3:30 pm on Dec 6, 2026 and costs $99.50."

# The SpokenNormalizer load-path study (part 4 of the README): all run with the project's Python.
FST_DIR = (
    "import importlib.util, os\n"
    "_d = os.path.join(importlib.util.find_spec('wetext').submodule_search_locations[0], 'fsts')\n"
)
# wetext's TokenParser (the reorder step between tagger and verbalizer) without `import wetext`: the
# package and wetext.constants are stubbed (constants.py up to its FST-loading table), so only the two
# FSTs asked for are read.
DIRECT = (
    FST_DIR + "import sys, types, kaldifst\n"
    "_p = os.path.dirname(_d)\n"
    "_src = open(os.path.join(_p, 'constants.py'), encoding='utf-8').read()\n"
    "_pkg = types.ModuleType('wetext'); _pkg.__path__ = [_p]; sys.modules['wetext'] = _pkg\n"
    "_c = types.ModuleType('wetext.constants'); sys.modules['wetext.constants'] = _c\n"
    "exec(_src[:_src.index('FSTS = {')], _c.__dict__)\n"
    "from wetext.token_parser import TokenParser\n"
    "_g = {}\n"
    "def direct(text, lang):\n"
    "    if lang not in _g:\n"
    "        _g[lang] = (kaldifst.TextNormalizer(os.path.join(_d, lang + '/tn/tagger.fst')),\n"
    "                    kaldifst.TextNormalizer(os.path.join(_d, lang + '/tn/verbalizer.fst')))\n"
    "    text = text.strip()\n"
    "    if lang != 'en' and not any(ch.isdigit() for ch in text):\n"
    "        return text\n"
    "    t, v = _g[lang]\n"
    "    return v(TokenParser(lang, 'tn').reorder(t(text).strip())).strip()\n"
)
LOAD_PATHS = {
    "import chattts_forge.runtime.spoken (no text)": "from chattts_forge.runtime.spoken import SPOKEN\n",
    "SPOKEN: zh sentence": f"from chattts_forge.runtime.spoken import SPOKEN\nSPOKEN.normalize({COLD_ZH!r})\n",
    "SPOKEN: en sentence": f"from chattts_forge.runtime.spoken import SPOKEN\nSPOKEN.normalize({COLD_EN!r})\n",
    "SPOKEN: zh + en sentences": (
        f"from chattts_forge.runtime.spoken import SPOKEN\nSPOKEN.normalize({COLD_ZH!r})\n"
        f"SPOKEN.normalize({COLD_EN!r})\n"
    ),
    "import kaldifst": "import kaldifst\n",
    "import wetext": "import wetext\n",
    "kaldifst direct: zh/tn tagger+verbalizer, zh sentence": (
        "import kaldifst\n" + FST_DIR + "_t = kaldifst.TextNormalizer(os.path.join(_d, 'zh/tn/tagger.fst'))\n"
        "_v = kaldifst.TextNormalizer(os.path.join(_d, 'zh/tn/verbalizer.fst'))\n"
        f"_v(_t({COLD_ZH!r}))\n"
    ),
    "kaldifst direct: en/tn tagger+verbalizer, en sentence": (
        "import kaldifst\n" + FST_DIR + "_t = kaldifst.TextNormalizer(os.path.join(_d, 'en/tn/tagger.fst'))\n"
        "_v = kaldifst.TextNormalizer(os.path.join(_d, 'en/tn/verbalizer.fst'))\n"
        f"_v(_t({COLD_EN!r}))\n"
    ),
    "kaldifst direct + reorder: zh sentence": DIRECT + f"direct({COLD_ZH!r}, 'zh')\n",
    "kaldifst direct + reorder: en sentence": DIRECT + f"direct({COLD_EN!r}, 'en')\n",
    "kaldifst direct + reorder: zh + en sentences": DIRECT
    + f"direct({COLD_ZH!r}, 'zh')\ndirect({COLD_EN!r}, 'en')\n",
    "kaldifst direct: zh + en, both sentences": (
        "import kaldifst\n"
        + FST_DIR
        + "_g = {l: (kaldifst.TextNormalizer(os.path.join(_d, l + '/tn/tagger.fst')),\n"
        "          kaldifst.TextNormalizer(os.path.join(_d, l + '/tn/verbalizer.fst'))) for l in ('zh', 'en')}\n"
        f"_g['zh'][1](_g['zh'][0]({COLD_ZH!r}))\n"
        f"_g['en'][1](_g['en'][0]({COLD_EN!r}))\n"
    ),
}


def setup_code(name: str, nemo_cache: str) -> str:
    return SETUP[name].replace("{nemo_cache!r}", repr(nemo_cache))


def cold_code(name: str, nemo_cache: str) -> str:
    return setup_code(name, nemo_cache) + f"f({COLD_ZH!r})\nf({COLD_EN!r})\n"


def worker(name: str, cases_json: str, reps: int, nemo_cache: str) -> None:
    cases = json.loads(Path(cases_json).read_text(encoding="utf-8"))
    ns: dict = {}
    t0 = time.perf_counter()
    exec(setup_code(name, nemo_cache), ns)
    setup_s = time.perf_counter() - t0
    f = ns["f"]

    def run(text: str) -> tuple[str, float]:
        t = time.perf_counter()
        try:
            out = f(text)
        except Exception as e:  # a crash is an output that scores as a miss
            out = f"<error {type(e).__name__}: {e}>"
        return out, time.perf_counter() - t

    outputs = [run(c["input"])[0] for c in cases]  # the warm-up pass also loads lazy grammars
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(reps):
        for i, c in enumerate(cases):
            times[i].append(run(c["input"])[1])
    per_case = [statistics.median(t) for t in times]
    versions = {}
    try:
        import importlib.metadata as md

        for dist in ("wetext", "kaldifst", "nemo-text-processing", "pynini", "cn2an", "num2words", "inflect"):
            try:
                versions[dist] = md.version(dist)
            except md.PackageNotFoundError:
                pass
    except Exception:
        pass
    torch_loaded = "torch" in sys.modules
    print(
        json.dumps(
            {
                "candidate": name,
                "setup_s": setup_s,
                "outputs": outputs,
                "per_case_s": per_case,
                "versions": versions,
                "python": sys.version.split()[0],
                "torch_in_sys_modules": torch_loaded,
            },
            ensure_ascii=False,
        )
    )


# ---- scoring ---------------------------------------------------------------------------------------

DIGIT_OR_CURRENCY = re.compile(r"[0-9０-９$€£¥￥＄]")


def _squash(s: str, cjk: bool) -> str:
    s = s.lower().replace("-", " ")
    return re.sub(r"\s+", "", s) if cjk else re.sub(r"\s+", " ", s).strip()


# ChatTTS control tags ([uv_break], [speed_5], ...): they must come out unchanged, and their digits are
# not digits left to speak.
TAG = re.compile(r"\[[A-Za-z_]+(?:_\d+)?\]")


def score(case: dict, output: str) -> tuple[bool, str]:
    """A hit: every control tag of the input still in the output; no digit (ASCII or full-width) and no
    currency sign left outside the tags; every expected substring present (case-insensitive, hyphens as
    spaces, runs of spaces as one; all spaces ignored when the expected substring holds CJK); and no
    `absent` substring present (compared exactly as written in the table)."""
    if output.startswith("<error"):
        return False, "error"
    for tag in TAG.findall(case["input"]):
        if tag not in output:
            return False, f"tag {tag} changed"
    if DIGIT_OR_CURRENCY.search(TAG.sub("", output)):
        return False, "digit/currency left"
    for exp in filter(None, (e.strip() for e in case["expect"].split(" | "))):
        cjk = bool(CJK.search(exp))
        if _squash(exp, cjk) not in _squash(output, cjk):
            return False, f"missing {exp!r}"
    for ab in filter(str.strip, case["absent"].split(" | ")):
        if ab in output:
            return False, f"has {ab!r}"
    return True, ""


def load_cases(path: Path) -> list[dict]:
    rows = path.read_text(encoding="utf-8").split("\n")
    header = rows[0].split("\t")
    cases = []
    for line in rows[1:]:
        if not line.strip():
            continue
        cols = line.split("\t")
        cols += [""] * (len(header) - len(cols))
        cases.append(dict(zip(header, cols[: len(header)], strict=True)))
    return cases


# ---- timing whole processes ------------------------------------------------------------------------

# Every child runs in an empty folder: `python -c` puts the current folder first on sys.path, and the
# repository root holds a `chattts_forge` folder that would shadow --spoken-tree.
NEUTRAL_CWD = tempfile.mkdtemp(prefix="textnorm-cwd-")


def time_cmd(cmd: list[str], env: dict | None = None, cpu: bool = False):
    """Wall seconds of one run (and, with cpu=True, its user+system CPU seconds as (wall, cpu))."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=NEUTRAL_CWD)
    dt = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[:2]} failed: {r.stderr.decode()[-2000:]}")
    if cpu:
        return dt, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return dt


def cold_start(python: str, code: str, runs: int, env: dict | None = None) -> dict:
    """A (python -c CODE) and B (python -c pass) interleaved A B A B after one warm-up of each; the
    figure is the median of the pairwise differences A - B."""
    a_cmd, b_cmd = [python, "-c", code], [python, "-c", "pass"]
    time_cmd(a_cmd, env), time_cmd(b_cmd, env)
    a, b = [], []
    for _ in range(runs):
        a.append(time_cmd(a_cmd, env, cpu=True))
        b.append(time_cmd(b_cmd, env, cpu=True))
    diffs = [x[0] - y[0] for x, y in zip(a, b, strict=True)]
    cpu_diffs = [x[1] - y[1] for x, y in zip(a, b, strict=True)]
    return {
        "median_diff_s": statistics.median(diffs),
        "min_diff_s": min(diffs),
        "max_diff_s": max(diffs),
        "median_a_s": statistics.median(x[0] for x in a),
        "median_b_s": statistics.median(y[0] for y in b),
        "cpu_median_diff_s": statistics.median(cpu_diffs),
        "cpu_min_diff_s": min(cpu_diffs),
        "cpu_max_diff_s": max(cpu_diffs),
        "runs": runs,
    }


def du_mb(path: Path) -> float:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) / 1024


def site_packages(venv: Path) -> Path:
    return next(venv.glob("lib/python*/site-packages"))


def pip_list(python: str) -> list[str]:
    out = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout
    return [line for line in out.split() if not line.startswith(("pip==", "setuptools=="))]


# ---- orchestrator ----------------------------------------------------------------------------------


def main_run(args: argparse.Namespace) -> None:
    project = Path(args.project).resolve()
    cases_path = (project / args.cases) if not Path(args.cases).is_absolute() else Path(args.cases)
    cases = load_cases(cases_path)
    pythons = {name: str(Path(v) / "bin" / "python") for name, v in (x.split("=", 1) for x in args.venv)}
    pythons["spoken"] = str(project / ".venv" / "bin" / "python")
    order = [n for n in SETUP if n in pythons]
    if args.only:
        order = [n for n in order if n in args.only.split(",")]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    spoken_env = dict(env)
    if args.spoken_tree:
        spoken_env["PYTHONPATH"] = str(Path(args.spoken_tree).resolve())
        results_commit = (Path(args.spoken_tree) / "COMMIT").read_text().strip()
    else:
        results_commit = (
            subprocess.run(
                ["git", "-C", str(project), "rev-parse", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            + " (working tree)"
        )
    results: dict = {
        "cases_file": str(cases_path),
        "cases_sha256": hashlib.sha256(cases_path.read_bytes()).hexdigest(),
        "n_cases": len(cases),
        "cases": cases,
        "spoken_commit": results_commit,
        "cold_zh": COLD_ZH,
        "cold_en": COLD_EN,
        "candidates": {},
    }
    if "spoken" in pythons:  # which spoken.py the project's Python imports under spoken_env (recorded)
        results["spoken_file"] = subprocess.run(
            [pythons["spoken"], "-c", "import chattts_forge.runtime.spoken as s; print(s.__file__)"],
            capture_output=True,
            text=True,
            env=spoken_env,
            cwd=NEUTRAL_CWD,
        ).stdout.strip()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as tf:
        json.dump(cases, tf, ensure_ascii=False)
    me = str(Path(__file__).resolve())
    for name in order:
        py = pythons[name]
        print(f"== {name} ({py})", file=sys.stderr, flush=True)
        r = subprocess.run(
            [py, me, "worker", name, tf.name, "--reps", str(args.reps), "--nemo-cache", args.nemo_cache],
            capture_output=True,
            text=True,
            env=spoken_env if name == "spoken" else env,
            cwd=NEUTRAL_CWD,
        )
        if r.returncode != 0:
            results["candidates"][name] = {"error": r.stderr[-3000:]}
            continue
        w = json.loads(r.stdout.strip().splitlines()[-1])
        scored = [score(c, o) for c, o in zip(cases, w["outputs"], strict=True)]
        w["hits"] = [h for h, _ in scored]
        w["why"] = [why for _, why in scored]
        w["coverage"] = sum(w["hits"]) / len(cases)
        # The weaker bar: nothing left that ChatTTS's front end would delete (digits, currency signs), tags intact.
        w["speakable"] = sum(why == "" or why.startswith(("missing", "has")) for why in w["why"]) / len(cases)
        w["coverage_by_lang"] = {}
        for lang in sorted({c["lang"] for c in cases}):
            idx = [i for i, c in enumerate(cases) if c["lang"] == lang]
            w["coverage_by_lang"][lang] = [sum(w["hits"][i] for i in idx), len(idx)]
        w["median_ms"] = statistics.median(w["per_case_s"]) * 1000
        w["p90_ms"] = statistics.quantiles(w["per_case_s"], n=10)[-1] * 1000
        if not args.no_cold:
            w["cold"] = cold_start(
                py, cold_code(name, args.nemo_cache), args.cold_runs, spoken_env if name == "spoken" else env
            )
        if name != "spoken" and args.empty_venv:
            w["install_mb"] = du_mb(site_packages(Path(py).parent.parent)) - du_mb(
                site_packages(Path(args.empty_venv))
            )
            w["installed"] = pip_list(py)
        results["candidates"][name] = w
        c = w.get("cold", {})
        print(
            f"   coverage {w['coverage']:.1%}  median {w['median_ms']:.3f} ms  cold {c.get('median_diff_s', float('nan')):.3f} s"
            f" (cpu {c.get('cpu_median_diff_s', float('nan')):.3f} s)"
            f"  install {w.get('install_mb', float('nan')):.1f} MB",
            file=sys.stderr,
            flush=True,
        )
    if args.load_paths:
        py = pythons["spoken"]
        results["load_paths"] = {}
        for label, code in LOAD_PATHS.items():
            results["load_paths"][label] = cold_start(py, code, args.cold_runs, spoken_env)
            lp = results["load_paths"][label]
            print(
                f"   {label}: {lp['median_diff_s']:.3f} s wall, {lp['cpu_median_diff_s']:.3f} s cpu",
                file=sys.stderr,
                flush=True,
            )
        # In-process: what each FST costs to load, and whether tagger -> verbalizer without wetext's
        # reorder step gives wetext's output on this table.
        probe = (
            FST_DIR + "import time, json, kaldifst\n"
            "r = {}\n"
            "for p in ('zh/tn/tagger.fst', 'zh/tn/verbalizer.fst', 'en/tn/tagger.fst', 'en/tn/verbalizer.fst'):\n"
            "    t = time.perf_counter(); kaldifst.TextNormalizer(os.path.join(_d, p)); r[p] = time.perf_counter() - t\n"
            "t = time.perf_counter(); import wetext; r['import wetext'] = time.perf_counter() - t\n"
            "print(json.dumps(r))\n"
        )
        results["load_paths_in_process_s"] = json.loads(
            subprocess.run(
                [py, "-c", probe], capture_output=True, text=True, check=True, env=spoken_env, cwd=NEUTRAL_CWD
            ).stdout
        )
        same = (
            DIRECT + "import json, re\n"
            "cases = json.load(open(sys.argv[1], encoding='utf-8'))\n"
            "out = []\n"
            "for c in cases:\n"
            "    t = c['input'].strip()\n"
            "    lang = 'zh' if re.search(r'[\\u4e00-\\u9fff]', t) or t.isdigit() else 'en'\n"
            "    try: out.append(direct(t, lang))\n"
            "    except Exception as e: out.append('<error %s>' % type(e).__name__)\n"
            "print(json.dumps(out, ensure_ascii=False))\n"
        )
        direct_out = json.loads(
            subprocess.run(
                [py, "-c", same, tf.name],
                capture_output=True,
                text=True,
                check=True,
                env=spoken_env,
                cwd=NEUTRAL_CWD,
            ).stdout
        )
        ref = results["candidates"].get("wetext-auto", {}).get("outputs")
        if ref:
            pairs = [
                (c["input"], r, d)
                for c, r, d in zip(cases, ref, direct_out, strict=True)
                if not r.startswith("<error")
            ]
            results["direct_vs_wetext"] = {
                "compared": len(pairs),
                "identical": sum(r == d for _, r, d in pairs),
                "examples": [p for p in pairs if p[1] != p[2]][:8],
            }
    if args.nemo_compile and "nemo" in pythons:
        results["nemo_compile"] = {}
        for lang in ("zh", "en"):
            with tempfile.TemporaryDirectory() as d:
                code = (
                    f"import logging\nlogging.disable(logging.INFO)\n"
                    f"from nemo_text_processing.text_normalization.normalize import Normalizer\n"
                    f"Normalizer(input_case='cased', lang={lang!r}, cache_dir={d!r})\n"
                )
                t = time_cmd([pythons["nemo"], "-c", code], env)  # runs in NEUTRAL_CWD
                results["nemo_compile"][lang] = {"wall_s": t, "far_mb": du_mb(Path(d))}
                print(f"   nemo compile {lang}: {t:.1f} s", file=sys.stderr, flush=True)
    os.unlink(tf.name)
    Path(args.out).write_text(json.dumps(results, ensure_ascii=False, indent=1), encoding="utf-8")
    print_report(results, cases)


def print_report(results: dict, cases: list[dict]) -> None:
    print(
        f"cases: {results['n_cases']} ({results['cases_file']}, sha256 {results['cases_sha256'][:12]}); "
        f"spoken at {results.get('spoken_commit')} ({results.get('spoken_file')})"
    )
    langs = next(
        iter(w["coverage_by_lang"] for w in results["candidates"].values() if "coverage_by_lang" in w), {}
    )
    print(
        f"| candidate | coverage | no digit/currency left | hits {' / '.join(langs)} | median ms/sentence (p90) | cold start s "
        "wall (min..max) | cold start CPU s | install MB | torch loaded |"
    )
    for name, w in results["candidates"].items():
        if "error" in w:
            print(f"| {name} | failed: {w['error'][-200:]!r} |")
            continue
        by = " / ".join(f"{h}/{n}" for h, n in w["coverage_by_lang"].values())
        c = w.get("cold", {})
        cold = (
            f"{c['median_diff_s']:.3f} ({c['min_diff_s']:.3f}..{c['max_diff_s']:.3f}) | "
            f"{c['cpu_median_diff_s']:.3f}"
            if c
            else "- | -"
        )
        inst = f"{w['install_mb']:.1f}" if "install_mb" in w else "-"
        print(
            f"| {name} | {w['coverage']:.1%} | {w['speakable']:.1%} | {by} | {w['median_ms']:.3f} ({w['p90_ms']:.3f}) | {cold} | {inst} "
            f"| {w['torch_in_sys_modules']} |"
        )
    for name, w in results["candidates"].items():
        if "error" in w:
            continue
        print(f"\n## {name}: misses {len(cases) - sum(w['hits'])}/{len(cases)}; versions {w['versions']}")
        if "installed" in w:
            print("installed:", " ".join(w["installed"]))
        for c, o, h, why in zip(cases, w["outputs"], w["hits"], w["why"], strict=True):
            if not h:
                print(f"  {c['id']}: {c['input']!r} -> {o!r}  [{why}]")
    for key in ("load_paths", "load_paths_in_process_s", "direct_vs_wetext", "nemo_compile"):
        if key in results:
            print(f"\n## {key}")
            print(json.dumps(results[key], ensure_ascii=False, indent=1))


def snapshot(project: Path, commit: str, dest: Path) -> None:
    """The chattts_forge package of `commit` laid out as installed (pyproject's package-dir mapping), for
    PYTHONPATH=dest: the project's own environment then imports that commit's code, not the working tree
    (its editable finder comes after PYTHONPATH)."""
    import shutil
    import tarfile

    import tomllib

    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "src.tar"
        subprocess.run(["git", "-C", str(project), "archive", "-o", str(tar), commit], check=True)
        src = Path(tmp) / "src"
        with tarfile.open(tar) as t:
            t.extractall(src)
        pkg_dir = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
        if dest.exists():
            shutil.rmtree(dest)
        for pkg, folder in sorted(pkg_dir.items(), key=lambda kv: kv[0].count(".")):
            target = dest.joinpath(*pkg.split("."))
            shutil.copytree(src / folder, target, dirs_exist_ok=True)
    (dest / "COMMIT").write_text(
        subprocess.run(
            ["git", "-C", str(project), "rev-parse", commit], capture_output=True, text=True, check=True
        ).stdout
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("candidate", choices=list(SETUP))
    w.add_argument("cases_json")
    w.add_argument("--reps", type=int, default=5)
    w.add_argument("--nemo-cache", default="/tmp/nemo-cache")
    r = sub.add_parser("run")
    r.add_argument("--project", default=str(Path(__file__).resolve().parents[3]))
    r.add_argument("--cases", default="tests/data/spoken_cases.tsv")
    r.add_argument("--venv", action="append", default=[], help="NAME=VENV_DIR (NAME: one of the candidates)")
    r.add_argument("--empty-venv", help="a fresh venv with nothing installed: the install-size baseline")
    r.add_argument("--nemo-cache", default="/tmp/nemo-cache")
    r.add_argument("--reps", type=int, default=5, help="timed passes over the table after one warm-up pass")
    r.add_argument("--cold-runs", type=int, default=10, help="A/B pairs per cold-start figure")
    r.add_argument("--no-cold", action="store_true")
    r.add_argument("--load-paths", action="store_true", help="the SpokenNormalizer load-path study")
    r.add_argument(
        "--nemo-compile", action="store_true", help="time nemo's first-ever grammar build (about a minute)"
    )
    r.add_argument("--only", help="comma-separated candidate names")
    r.add_argument("--spoken-tree", help="a `snapshot` folder: spoken runs import that commit's code")
    r.add_argument("--out", default="textnorm-results.json")
    sn = sub.add_parser("snapshot", help="lay out COMMIT's chattts_forge package in DEST (for --spoken-tree)")
    sn.add_argument("commit")
    sn.add_argument("dest")
    sn.add_argument("--project", default=str(Path(__file__).resolve().parents[3]))
    rp = sub.add_parser("report", help="print the report of a saved results file")
    rp.add_argument("results")
    a = ap.parse_args()
    if a.cmd == "worker":
        worker(a.candidate, a.cases_json, a.reps, a.nemo_cache)
    elif a.cmd == "snapshot":
        snapshot(Path(a.project), a.commit, Path(a.dest))
    elif a.cmd == "run":
        main_run(a)
    else:
        res = json.loads(Path(a.results).read_text(encoding="utf-8"))
        print_report(res, res["cases"])


if __name__ == "__main__":
    main()
