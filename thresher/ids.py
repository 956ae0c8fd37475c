"""Content-hash ids shared by every stage, so re-running a step is idempotent."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """`value` as the JSON ids are hashed from: sorted keys, no spaces, non-JSON as str."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def content_id(*parts: Any) -> str:
    """A stable 16-hex-digit id from JSON-serialisable parts."""
    return hashlib.blake2b(canonical_json(parts).encode(), digest_size=8).hexdigest()


def seeded_key(seed: int, item_id: str) -> str:
    """A stable pseudo-random sort key of an id under a seed (a seeded shuffle)."""
    return hashlib.blake2b(f"{seed}:{item_id}".encode(), digest_size=8).hexdigest()
