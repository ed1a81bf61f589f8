"""The `chattts-forge` command: one subcommand per stage, each loaded only when it is used.

Subcommands are imported lazily so that `chattts-forge synth` or `score` never pays for (or
needs) torch, which only the export side (checkpoint reference, convert, calibrate) imports.
"""

from __future__ import annotations

import importlib

import click

from chattts_forge import __version__
from chattts_forge.errors import ForgeError
from chattts_forge.log import setup_logging

# name -> ("module", "attribute", "one-line help shown in `chattts-forge --help`")
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "checkpoint": (
        "chattts_forge.checkpoint.cli",
        "checkpoint",
        "Synthesize, verify and inspect ChatTTS checkpoints.",
    ),
    "reference": (
        "chattts_forge.torch_ref.cli",
        "reference",
        "Synthesize with ChatTTS's own PyTorch code (the parity oracle).",
    ),
    "convert": (
        "chattts_forge.convert.cli",
        "convert",
        "Export every ChatTTS component to ONNX FP32/FP16 with checked parity.",
    ),
    "synth": (
        "chattts_forge.runtime.cli",
        "synth",
        "Synthesize speech from an ONNX artifact (torch-free runtime).",
    ),
    "normalize": (
        "chattts_forge.runtime.cli",
        "normalize",
        "Print exactly the text the model receives for a text: its spoken form, one segment per line.",
    ),
    "warm": (
        "chattts_forge.runtime.cli",
        "warm",
        "Pre-synthesize a phrase list into a phrase cache (synth --cache).",
    ),
    "serve": (
        "chattts_forge.runtime.serve.cli",
        "serve",
        "Serve an artifact over HTTP (OpenAI-compatible speech, streaming, continuous batching).",
    ),
    "calibrate": (
        "chattts_forge.calibration_data.cli",
        "calibrate",
        "Record calibration inputs of every quantizable graph from a text corpus.",
    ),
    "quantize": (
        "chattts_forge.quantize.cli",
        "quantize",
        "Quantize an FP32 artifact: dynamic INT8, static INT8 (QDQ) or INT4 weight-only.",
    ),
    "evaluate": (
        "chattts_forge.evaluate.cli",
        "evaluate",
        "Run the quality gate on an artifact and write JSON/Markdown/HTML reports.",
    ),
    "evaluate-reference": (
        "chattts_forge.evaluate.cli",
        "evaluate_reference",
        "Measure the FP32 reference's side of every evaluation once (evaluate --reference-run).",
    ),
    "evaluate-latency": (
        "chattts_forge.evaluate.cli",
        "evaluate_latency",
        "Time every variant against the FP32 reference in the same interleaved rounds (evaluate --latency-run).",
    ),
    "score": (
        "chattts_forge.evaluate.cli",
        "score",
        "Score audio against transcripts with a real ASR (WER/CER).",
    ),
    "bench": (
        "chattts_forge.evaluate.bench_cli",
        "bench",
        "Benchmark an artifact against ChatTTS's PyTorch pipeline in one run.",
    ),
    "publish": (
        "chattts_forge.publish.cli",
        "publish",
        "Publish an artifact that passed the gate, with a verifiable manifest.",
    ),
    "verify": (
        "chattts_forge.publish.cli",
        "verify",
        "Re-hash published artifacts against their manifests.",
    ),
    "build": (
        "chattts_forge.driver.cli",
        "build",
        "Run every stage, incrementally and kill-safe, then publish what passed (`make artifacts`).",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        module_name, attr, short_help = SUBCOMMANDS[cmd_name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            missing = e.name or "?"
            hint = (
                "install the export extra: pip install -e '.[export]'"
                if missing.split(".")[0] in {"torch", "torchaudio", "ChatTTS", "vocos", "transformers"}
                else f"install the missing package '{missing}'"
            )

            @click.command(cmd_name, help=short_help, context_settings={"ignore_unknown_options": True})
            @click.argument("args", nargs=-1, type=click.UNPROCESSED)
            def unavailable(args: tuple[str, ...]) -> None:
                raise ForgeError(f"'{cmd_name}' is unavailable: module {missing} not found; {hint}")

            return unavailable
        cmd = getattr(module, attr)
        if not cmd.short_help:
            cmd.short_help = short_help
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Use the static one-liners so `--help` never imports a stage.
        rows = [(name, spec[2]) for name, spec in SUBCOMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except ForgeError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)  # the error's type decides (chattts_forge.errors)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="chattts-forge")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for library debug logs).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
def main(verbose: int, quiet: bool) -> None:
    """Build fast, verified ONNX artifacts from a ChatTTS checkpoint.

    \b
    Pipeline (each stage is also a library function under chattts_forge.*):
      checkpoint synthesize/verify -> convert -> calibrate -> quantize -> evaluate -> publish
    `make artifacts` runs all of it on the embedded default checkpoint.
    """
    setup_logging(-1 if quiet else verbose)


if __name__ == "__main__":
    main()
