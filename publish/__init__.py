"""publish stage: gated, atomic publication with a verifiable manifest.

Library:
- `publish_artifact(artifact_dir, report_dir, to="artifacts", model=None, version=None)` ->
  `PublishResult` (chattts_forge.publish.publish): refuses unless the report passed, is sealed
  (integrity) and names exactly the artifact's re-hashed files; writes `to/<model>/<version>/<variant>/`
  through a staging folder and one rename; never overwrites a published version.
- `verify_path(path)` -> `VerifyResult` (chattts_forge.publish.verify): re-hashes a variant or a tree.
- `rewrite_index(root)` / `publish_lock(root)` (chattts_forge.publish.index): `index.json` under a lock.

The driver that runs every stage and then publishes (`make artifacts`) is chattts_forge.driver.

The manifest schema is documented in docs/manifest.md.
"""

from chattts_forge.publish.publish import PublishResult, publish_artifact
from chattts_forge.publish.verify import VerifyResult, verify_path

__all__ = ["PublishResult", "VerifyResult", "publish_artifact", "verify_path"]
