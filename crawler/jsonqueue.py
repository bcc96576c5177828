"""JSON serializer for requests queued in Redis (scrapy-redis `SCHEDULER_SERIALIZER`).

scrapy-redis pickles queued requests by default; a queue shared between machines would then
execute whatever a compromised peer pushes. Request dicts (`Request.to_dict()`) hold only
str, bytes, numbers, lists and dicts: bytes travel as ``{"__b64__": "..."}``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

_TAG = "__b64__"


def _encode(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return {_TAG: base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, dict):
        return {(k.decode("latin-1") if isinstance(k, bytes) else k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    return obj


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if len(obj) == 1 and _TAG in obj:
            return base64.b64decode(obj[_TAG])
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def dumps(obj: Any) -> bytes:
    return json.dumps(_encode(obj), separators=(",", ":")).encode("utf-8")


def loads(data: bytes | str) -> Any:
    return _decode(json.loads(data))
