"""`chattts-forge publish` and `chattts-forge verify`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from chattts_forge.errors import ForgeError
from chattts_forge.publish.regression_gate import regression_options


@click.command("publish")
@click.option(
    "--artifact",
    "artifact",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Artifact folder (output of convert or quantize).",
)
@click.option(
    "--report",
    "report",
    required=True,
    type=click.Path(path_type=Path),
    help="Evaluation report folder (holding report.json) that judged this artifact.",
)
@click.option(
    "--to",
    "to",
    default="artifacts",
    show_default=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Root of the published tree: writes TO/<model>/<version>/<variant>/.",
)
@click.option("--model", default=None, help="Model name (default: chattts, or chattts-synthetic-<preset>-seed<N>).")
@click.option(
    "--version",
    "version",
    default=None,
    help="Version folder (default: the newest version of the same checkpoint lacking this variant, else a new vN).",
)
@click.option(
    "--sign-key",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="PEM EC private key to sign with (default: your own key pair in $XDG_CONFIG_HOME/chattts-forge/, "
    "made on first use).",
)
@regression_options
def publish(artifact: Path, report: Path, to: Path, **options: Any) -> None:
    """Publish an artifact that passed the quality gate, with manifest.json, SHA256SUMS, a model card
    and model.sig (OpenSSF Model Signing; the public key is written to TO/signing-key.pub).

    Refuses (nothing is written) when the report failed, was edited after evaluation, or judged
    other files than the artifact's current ones. Never overwrites a published version.

    Like a build, compares the artifact with the same variant of the newest published version of its
    model in TO (--baseline vN to choose, --no-baseline to skip) and refuses it (exit 2) when it is
    worse beyond the [regression] tolerances its report was judged with, unless --accept-regression.
    """
    from chattts_forge.publish.regression import summary
    from chattts_forge.publish.regression_gate import RegressionPolicy, publish_judged

    policy = RegressionPolicy.from_options(options.pop("baseline"), options.pop("no_baseline"),
                                           options.pop("accept_regression"), options.pop("reason"))
    # what is left, --model, --version and --sign-key, are publish_judged's keywords of the same names
    result = publish_judged(artifact, report, to, policy, **options,
                            announce=lambda variant, rec: click.echo(f"regression gate: {summary(variant, rec)}"))
    word = "already published (identical files)" if result.status == "already-published" else "published"
    click.echo(f"{word}: {result.path}")
    click.echo(f"manifest sha256: {result.manifest_sha256}")
    click.echo(f"signed: {result.path / 'model.sig'} (public key: {result.public_key})")


@click.command("verify")
@click.argument("path", type=click.Path(path_type=Path, file_okay=False), default="artifacts")
@click.option(
    "--public-key",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="PEM public key: every variant's and version's model.sig must verify with it (e.g. artifacts/signing-key.pub).",
)
def verify(path: Path, public_key: Path | None) -> None:
    """Re-hash a published variant folder, or every variant under PATH, against the manifests (and,
    with --public-key, against their signatures).

    Any changed, missing or extra file fails (exit 2) and is named.
    """
    from chattts_forge.publish.verify import verify_path

    result = verify_path(path, public_key=public_key)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    for problem in result.problems:
        click.echo(f"FAILED {problem}", err=True)
    if result.problems:
        first = result.problems[0]
        more = f" (+{len(result.problems) - 1} more)" if len(result.problems) > 1 else ""
        raise ForgeError(f"verification failed: {first}{more}")
    for vdir in result.variants:
        click.echo(f"OK {vdir}")
    for version_dir in result.versions:
        click.echo(f"OK {version_dir} (version manifest: routing.json, phrase cache)")
    if public_key is not None:
        click.echo(f"signatures verified with {public_key}: {len(result.signatures)} folder(s)")
    elif any((v / "model.sig").is_file() for v in result.variants):
        click.echo("note: the signatures (model.sig) were not checked; give --public-key KEY (the tree names "
                   "its key in signing-key.pub)", err=True)
    click.echo(f"verified {len(result.variants)} published variant(s) under {path}")
