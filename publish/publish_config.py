"""What one `chattts-forge publish` is asked to publish, and where: `PublishConfig`, each option
declared once on its field (chattts_forge.options); the regression options it shares with
`chattts-forge build` are publish.regression_gate's."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from pathlib import Path

import click

from chattts_forge.options import option


@dataclass(frozen=True)
class PublishConfig:
    """The artifact, the report that judged it, the published tree (`to`), and optionally the model
    name, the version folder and the signing key (`regression_gate.publish_judged`'s keywords)."""

    artifact: Path = option(MISSING, "--artifact", "Artifact folder (output of convert or quantize).",
                            kind=click.Path(path_type=Path, file_okay=False))
    report: Path = option(MISSING, "--report", "Evaluation report folder (holding report.json) that judged this artifact.",
                          kind="path")
    to: Path = option(Path("artifacts"), "--to", "Root of the published tree: writes TO/<model>/<version>/<variant>/.",
                      kind=click.Path(path_type=Path, file_okay=False), show_default=True)
    model: str | None = option(
        None, "--model", "Model name (default: chattts, or chattts-synthetic-<preset>-seed<N>).")
    version: str | None = option(
        None, "--version",
        "Version folder (default: the newest version of the same checkpoint lacking this variant, else a new vN).")
    sign_key: Path | None = option(
        None, "--sign-key", "PEM EC private key to sign with (default: your own key pair in "
        "$XDG_CONFIG_HOME/chattts-forge/, made on first use).", kind="file")
