"""Convoy fields kept as `key: value` lines in a convoy bead's description (Gas Town format)."""

from collections.abc import Mapping

KEYS = {
    "owner": "owner",
    "notify": "notify",
    "molecule": "molecule",
    "merge": "merge",
    "base_branch": "base_branch",
    "base-branch": "base_branch",
    "basebranch": "base_branch",
    "watchers": "watchers",
    "nudge_watchers": "nudge_watchers",
    "nudge-watchers": "nudge_watchers",
    "nudgewatchers": "nudge_watchers",
    "completion_notified_at": "completion_notified_at",
    "completion-notified-at": "completion_notified_at",
    "completionnotifiedat": "completion_notified_at",
}
ORDER = [
    ("owner", "Owner"),
    ("notify", "Notify"),
    ("merge", "Merge"),
    ("molecule", "Molecule"),
    ("base_branch", "base_branch"),
    ("watchers", "Watchers"),
    ("nudge_watchers", "nudge_watchers"),
    ("completion_notified_at", "completion_notified_at"),
]


def split_description(description: str | None) -> tuple[dict[str, str], str]:
    """-> (fields dict, the description without its field lines)."""
    fields, other = {}, []
    for line in (description or "").split("\n"):
        stripped = line.strip()
        key, sep, value = stripped.partition(":")
        canonical = KEYS.get(key.strip().lower()) if sep else None
        if canonical:
            if value.strip():
                fields[canonical] = value.strip()
            continue
        other.append(line)
    while other and not other[0].strip():
        other.pop(0)
    while other and not other[-1].strip():
        other.pop()
    return fields, "\n".join(other)


def join_description(text: str, fields: Mapping[str, object]) -> str:
    formatted = "\n".join(f"{label}: {fields[key]}" for key, label in ORDER if fields.get(key))
    if text and formatted:
        return f"{text}\n{formatted}"
    return text or formatted
