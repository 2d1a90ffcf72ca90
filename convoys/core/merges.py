"""What a merge looks like in text: a close reason's outcome, a merge-request bead's fields and
the bead ids a branch name or a pull request's text names. Pure: no Django.

A worker closes its bead when the work is done ("Implemented …"); the merge is another record:
a `merge-request` bead whose description names its `source_issue:`, `branch:` and `target:`,
closed later with a reason such as "Merged to main at 1e2a068b" or "Stale MR - cleanup", or a
forge's pull request. Which reasons mean merged and which abandoned are settings (lists of
case-insensitive regular expressions, searched anywhere in the reason); abandoned ones are
tried first, so "REJECTED: already on main" is abandoned, not merged.
"""

import re
from collections.abc import Callable, Iterable, Sequence

from convoys.core.ids import BEAD_ID_MAX

MERGED, ABANDONED, OPEN = "merged", "abandoned", "open"
OUTCOMES = (MERGED, ABANDONED)
# A bead closed with one of these was merged by its own close (the refinery's and `gt done
# --merge=direct`'s words): no merge-request bead follows.
SELF_MERGED_PREFIXES = ("Merged in ", "Direct merge to ")
MR_FIELDS = ("branch", "target", "source_issue", "rig")
_FIELD = re.compile(r"^\s*(branch|target|source_issue|rig):\s*(\S+)\s*$", re.MULTILINE)
# What may be a bead id inside free text: letters and digits around at least one '-' (the
# ends' '.' and '_' stripped). Possessive, and only from the start of a run: linear time on
# any text (a forge sends up to 1 MiB of it).
_CANDIDATE = re.compile(r"(?<![A-Za-z0-9._])[A-Za-z0-9._]++(?:-[A-Za-z0-9._]++)+")


def compiled(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    """The settings' patterns, compiled case-insensitively (ValueError names a bad one)."""
    result = []
    for pattern in patterns:
        try:
            result.append(re.compile(pattern, re.IGNORECASE))
        except re.error as exc:
            raise ValueError(f"merge reason pattern {pattern!r}: {exc}") from None
    return result


def outcome_of(
    reason: str, merged: Sequence[re.Pattern[str]], abandoned: Sequence[re.Pattern[str]]
) -> str:
    """ "merged", "abandoned" or "" (the reason says neither) for a merge request's close."""
    text = (reason or "").strip()
    if not text:
        return ""
    if any(p.search(text) for p in abandoned):
        return ABANDONED
    if any(p.search(text) for p in merged):
        return MERGED
    return ""


def self_merged(reason: str) -> bool:
    """Whether a bead's own close reason says its work was merged."""
    return (reason or "").startswith(SELF_MERGED_PREFIXES)


def mr_fields(description: str) -> dict[str, str]:
    """The `key: value` lines of a merge-request bead's description that the product reads."""
    return {
        key: value
        for key, value in _FIELD.findall(description or "")
        if value.lower() not in ("null", "none", "")
    }


def named_ids(texts: Iterable[str], known: Callable[[Sequence[str]], set[str]]) -> list[str]:
    """The bead ids that `texts` name (a branch such as `polecat/nux/gt-abc12`, a title, a
    body), first mention first; `known` says which candidates exist."""
    candidates: dict[str, None] = {}  # ordered, without repeats
    for text in texts:
        for match in _CANDIDATE.finditer(text or ""):
            word = match.group(0).strip("._")
            for candidate in (word, *_segments(word)):
                if len(candidate) <= BEAD_ID_MAX:
                    candidates.setdefault(candidate)
    if not candidates:
        return []
    found = known(list(candidates))
    return [c for c in candidates if c in found]


def _segments(word: str) -> list[str]:
    """The shorter ids inside a longer word, longest first: `fix-gt-abc12` also names
    `gt-abc12`. Only those short enough to be an id, so a long word costs little."""
    parts = word.split("-")
    found: list[str] = []
    length = len(parts[-1])
    for i in range(len(parts) - 2, 0, -1):
        length += 1 + len(parts[i])
        if length > BEAD_ID_MAX:
            break
        found.append("-".join(parts[i:]))
    return found[::-1]
