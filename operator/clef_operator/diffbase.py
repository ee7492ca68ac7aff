"""kopf's diff base as a hash: a fixed-size annotation instead of a copy of the whole spec.

kopf decides whether a ClefDecision changed by comparing its "essence" (spec, labels, annotations) with the
one it stored after the last handled change; its stock storages keep the whole essence in an annotation or
in status, so a large spec is stored twice and a spec over 256 KiB makes every write of the object fail (the
API server caps all annotations of an object at 256 KiB). The operator reads no ``old``/``diff`` from kopf:
every pass is level-triggered from the current spec, so a digest of the essence is enough to tell "changed"
from "unchanged". An annotation written by an older operator (the JSON essence) is still read, and replaced
by the digest on the next handled change.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import kopf

DIGEST_PREFIX = "sha256:"
# What fetch() answers for a changed object: an essence that differs from any real one.
CHANGED: dict[str, Any] = {"spec": {"clef-serving.io/changed-since-last-handled": True}}


def digest(essence: Any) -> str:
    """The stored form: sha256 of the essence's canonical JSON."""
    canonical = json.dumps(essence, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return DIGEST_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff base, holding a 71-character digest of the essence instead of the essence."""

    def fetch(self, *, body: kopf.Body) -> Any:
        for full_key in self.make_keys(self.key, body=body):
            stored = body.metadata.annotations.get(full_key)
            if stored is None:
                continue
            if not stored.startswith(DIGEST_PREFIX):
                return json.loads(stored)  # written by an older operator
            current = self.build(body=body)
            return current if digest(current) == stored.strip() else CHANGED
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        for full_key in self.make_keys(self.key, body=body):
            patch.metadata.annotations[full_key] = digest(essence)
        self._store_marker(prefix=self.prefix, patch=patch, body=body)
