"""`chattts-forge publish` and `chattts-forge verify`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from chattts_forge.errors import ForgeError
from chattts_forge.options import declared_options
from chattts_forge.publish.publish_config import PublishConfig
from chattts_forge.publish.regression_gate import RegressionPolicy, publish_judged, regression_options
from chattts_forge.publish.verify import verify_path


@click.command("publish")
@declared_options(PublishConfig)
@regression_options
def publish(baseline: str | None, no_baseline: bool, accept_regression: tuple[str, ...], reason: str,
            **options: Any) -> None:
    """Publish an artifact that passed the quality gate, with manifest.json, SHA256SUMS, a model card
    and model.sig (OpenSSF Model Signing; the public key is written to TO/signing-key.pub).

    Refuses (nothing is written) when the report failed, was edited after evaluation, or judged
    other files than the artifact's current ones. Never overwrites a published version.

    Like a build, compares the artifact with the same variant of the newest published version of its
    model in TO (--baseline vN to choose, --no-baseline to skip) and refuses it (exit 2) when it is
    worse beyond the [regression] tolerances its report was judged with, unless --accept-regression.
    """
    from chattts_forge.publish.regression import summary

    policy = RegressionPolicy.from_options(baseline, no_baseline, accept_regression, reason)
    config = PublishConfig(**options)
    result = publish_judged(config.artifact, config.report, config.to, policy, model=config.model,
                            version=config.version, sign_key=config.sign_key,
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
