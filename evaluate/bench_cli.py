"""`chattts-forge bench`: the artifact's runtime against ChatTTS's PyTorch FP32, in one run.

The command's options are declared on `BenchOptions` (evaluate/bench_options.py), which maps them onto
a `BenchConfig` for `chattts_forge.evaluate.bench.run_bench` (or, with --load, a `LoadBenchConfig` for
`load_bench.run_load_bench`; with --soak, a `SoakConfig` for `soak.run_soak`); docs/bench.md lists the
JSON keys.
"""

from __future__ import annotations

from typing import Any

import click

from chattts_forge.evaluate.bench import format_table, run_bench
from chattts_forge.evaluate.bench_options import BenchOptions
from chattts_forge.evaluate.load_bench import format_load_table, run_load_bench
from chattts_forge.evaluate.soak import run_soak
from chattts_forge.evaluate.soak_output import format_soak
from chattts_forge.options import declared_options


@click.command("bench")
@declared_options(BenchOptions)  # every option, declared once on its field (evaluate/bench_options.py)
def bench(**options: Any) -> None:
    """Benchmark an artifact against ChatTTS's PyTorch pipeline in one run.

    \b
    Per-step latency (GPT alone and full step), code-stage and end-to-end RTF for `--steps`
    steps of audio, first audio when streaming, real-time streams per batch size, peak RSS,
    each as a ratio to the PyTorch baseline of the same run. Timings are medians [p10-p90].
    """
    opts = BenchOptions(**options)
    if opts.soak_s is not None:
        _soak(opts)
    elif opts.load:
        _load_bench(opts)
    else:
        _bench(opts)


def _say(msg: str) -> None:
    click.echo(msg, err=True)


def _bench(opts: BenchOptions) -> None:
    """The plain benchmark: `bench.run_bench`."""
    report = run_bench(opts.artifact, opts.bench_config(), json_out=opts.json_out, progress=_say)
    click.echo(format_table(report))
    if opts.json_out:
        click.echo(f"wrote {opts.json_out}")


def _load_bench(opts: BenchOptions) -> None:
    """`bench --load`: `load_bench.run_load_bench`."""
    report = run_load_bench(opts.load_config(), progress=_say)
    click.echo(format_load_table(report))
    if opts.json_out:
        click.echo(f"wrote {opts.json_out}")


def _soak(opts: BenchOptions) -> None:
    """`bench --soak SECONDS --url URL`: evaluate.soak against a running server."""
    cfg = opts.soak_config()
    report = run_soak(cfg, json_out=opts.json_out, plot_out=opts.plot, progress=_say)
    click.echo(format_soak(report))
    for path in (opts.json_out, opts.plot):
        if path:
            click.echo(f"wrote {path}")
