"""What a number or a JSON document sent by a client may be: one rule for every entry (query
strings, forms, API bodies, websocket frames), so no input reaches int() or the JSON decoder
in a shape they fail on with anything but a refusal. No Django. A due time (`due_time`) is
an RFC 3339 time with its zone.

- A whole number is written in ASCII digits 0-9 (surrounding spaces allowed) and fits its
  bound: `²`, `٣` and `𝟗` are digits to str.isdigit() but int() refuses or misreads them, and
  int() refuses more than 4,300 digits. Anything else is None: the caller's default.
- A JSON document nests at most MAX_JSON_DEPTH arrays and objects: the decoder recurses once
  per level (100,000 levels was a RecursionError, a 500), and so does everything that walks
  the value afterwards (validation, error answers, encoding).
"""

import json
from datetime import UTC, datetime
from typing import Any

BIGINT = 2**63 - 1  # the largest value of a bigint column (sequence numbers, row ids)
MAX_JSON_DEPTH = 32  # no body or frame of ours nests more than 3


def whole_number(text: str | None, most: int = BIGINT) -> int | None:
    """The number `text` writes in ASCII digits, if it is at most `most`; else None."""
    text = (text or "").strip()
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(most)):
        return None
    number = int(text)
    return number if number <= most else None


class NotJson(ValueError):
    """A document that is not JSON, or nests too deep; the message says which, in a few words."""


def json_document(raw: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The value of a JSON document (as the standard decoder reads it), or NotJson."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise NotJson(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise NotJson(f"not JSON ({exc})") from None
    if _deeper_than(value, max_depth):
        raise NotJson(f"nested deeper than {max_depth} levels")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Does `value` nest more than `limit` arrays and objects? Without recursion."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def due_time(text: str) -> datetime:
    """An RFC 3339 time with its zone ("2026-12-24T17:00Z", "…+01:00"), in UTC; ValueError
    says what is wrong in a few words."""
    value = (text or "").strip()
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value[:40]!r} is not a time like 2026-12-24T17:00Z") from None
    if "T" not in value.upper() and " " not in value:
        raise ValueError(f"{value[:40]!r} names a day but no time: say 2026-12-24T17:00Z")
    if moment.tzinfo is None:
        raise ValueError(f"{value[:40]!r} has no time zone: end it with Z or an offset (+01:00)")
    return moment.astimezone(UTC)
