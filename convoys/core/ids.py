"""What a bead or convoy id, a rig name, a route prefix and an assignee may be: one rule, used
by every entry (import, command line, API, admin), so that every exit (URLs, HTML and SVG,
JSON, e-mail, channel groups, dispatcher argv, export) can take anything accepted. No Django.

bd itself only asks an explicit id to contain a '-' (the text before it is the prefix) and
stores at most 255 characters (its column's limit); every id in the real exports is
lowercase ASCII letters, digits, '-' and '.'. The rule here keeps all of them and refuses what
breaks an exit or fools a reader:

- ids: 1..255 characters (convoys: 64, their column) of Unicode letters, combining marks,
  decimal digits and '-', '.', '_'; the first is a letter or a digit (no option-like '-x', no
  '.' or '..' path segment); Unicode NFC, so two ids that look the same are the same id.
  No '/', ':', space, quote, '$', '{', '<' or other punctuation.
- rig names and route prefixes reach the dispatch command (a rig also starts every worker's
  name), maybe through a shell: ASCII letters, digits and '-', '.', '_' only, the first a
  letter or a digit (so no '/', '.' or '..', no option, nothing a shell reads). A prefix ends
  with '-'.
- names (assignees, workers): free text up to their column length, but not starting
  with '-' (never an option in a dispatcher's argv) and without control or format characters
  (NUL, newlines, bidirectional overrides) or lone surrogates.
- text (titles, descriptions, reasons, any stored string): anything but NUL (PostgreSQL stores
  none) and lone surrogates (not encodable as UTF-8).

Every `*_problem` function returns why a value is refused, in a few words, or None.
"""

import hashlib
import re
import unicodedata
from urllib.parse import quote

BEAD_ID_MAX = 255
CONVOY_ID_MAX = 64
RIG_NAME_MAX = 100
ROUTE_PREFIX_MAX = 100
ROUTE_PATH_MAX = 500
NAME_MAX = 255
RAW_TARGET_MAX = 300  # `external:<x>:<id>` as written
ID_PUNCTUATION = "-._"
# Categories never accepted in a name: control, format (bidi overrides, zero-width), surrogate,
# private use, unassigned, line and paragraph separators.
FORBIDDEN_IN_NAMES = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))
PLAIN_ID = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._-]*")  # every real id: checked without a loop
SAFE_NAME_CHARACTERS = "letters, digits, '-', '.' and '_' only"


def _describe(char: str) -> str:
    return f"{char!r} (U+{ord(char):04X})"


def _starts_id(char: str) -> bool:
    return unicodedata.category(char)[0] == "L" or unicodedata.category(char) == "Nd"


def _in_id(char: str) -> bool:
    category = unicodedata.category(char)
    return category[0] in "LM" or category == "Nd" or char in ID_PUNCTUATION


def text_problem(value: str) -> str | None:
    """Why a stored string is refused: a NUL or a lone surrogate."""
    if "\x00" in value:
        return "contains a NUL character (U+0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate {_describe(value[exc.start])}"
    return None


def id_problem(value: object, max_length: int = BEAD_ID_MAX) -> str | None:
    if not isinstance(value, str):
        return "expected a string"
    if not value:
        return "must not be empty"
    if len(value) > max_length:
        return f"is {len(value)} characters long (at most {max_length})"
    if PLAIN_ID.fullmatch(value):
        return None
    if not _starts_id(value[0]):
        return f"must start with a letter or a digit, not {_describe(value[0])}"
    for char in value:
        if not _in_id(char):
            return f"character {_describe(char)} is not allowed ({SAFE_NAME_CHARACTERS})"
    if not unicodedata.is_normalized("NFC", value):
        return "must be in Unicode normal form NFC"
    return None


def convoy_id_problem(value: object) -> str | None:
    return id_problem(value, CONVOY_ID_MAX)


def _control_problem(value: str) -> str | None:
    if value.isprintable():  # no Cc, Cf, Cs, Co, Cn, Zl, Zp (nor spaces other than ' ')
        return None
    for char in value:
        if unicodedata.category(char) in FORBIDDEN_IN_NAMES:
            return f"contains the control or format character {_describe(char)}"
    return None


def name_problem(value: object, max_length: int = NAME_MAX) -> str | None:
    """Rig names, assignees, worker names: no leading '-', no control characters."""
    if not isinstance(value, str):
        return "expected a string"
    if len(value) > max_length:
        return f"is {len(value)} characters long (at most {max_length})"
    if value.startswith("-"):
        return "must not start with '-'"
    return _control_problem(value)


def safe_name_problem(value: object, max_length: int) -> str | None:
    """Rig names and route prefixes: what may reach a command, even one run by a shell."""
    if not isinstance(value, str):
        return "expected a string"
    if not value:
        return "must not be empty"
    if len(value) > max_length:
        return f"is {len(value)} characters long (at most {max_length})"
    if PLAIN_ID.fullmatch(value):
        return None
    if not (value[0].isascii() and value[0].isalnum()):
        return f"must start with a letter or a digit, not {_describe(value[0])}"
    char = next(c for c in value if not (c.isascii() and (c.isalnum() or c in ID_PUNCTUATION)))
    return f"character {_describe(char)} is not allowed (ASCII {SAFE_NAME_CHARACTERS})"


def rig_name_problem(value: str) -> str | None:
    return safe_name_problem(value, RIG_NAME_MAX)


def route_path_problem(path: str) -> str | None:
    """A routes.jsonl path: its first component is the rig's name ('.' is the town)."""
    problem = name_problem(path, ROUTE_PATH_MAX)
    if problem:
        return problem
    if path.strip().startswith(("/", "~/")) or path.strip() == "~":
        # '/tmp/gastown/mayor/rig' would name the rig 'tmp': a town's routes are relative.
        return (
            "is absolute: give it relative to the town's root, its first part naming the rig "
            "(e.g. 'gastown/mayor/rig')"
        )
    rig = rig_name_from_path(path)
    if rig is None:
        return None
    problem = rig_name_problem(rig)
    return problem and f"rig name {rig[:40]!r} {problem}"


def route_prefix_problem(value: str) -> str | None:
    problem = safe_name_problem(value, ROUTE_PREFIX_MAX)
    if problem:
        return problem
    if not value.endswith("-"):
        return "must end with '-'"
    return None


def unwrap_external(target: str) -> str:
    """`external:<x>:<id>` -> `<id>`; anything else unchanged."""
    if target.startswith("external:"):
        parts = target.split(":", 2)
        if len(parts) == 3 and parts[2]:
            return parts[2]
    return target


def target_problem(raw: object) -> str | None:
    """A dependency or tracking target as written: a bead id, known or not (another rig's, a
    deleted one), or `external:<x>:<id>`. Kept as it is, so only what breaks a line or a
    column is refused; pages link it only when it names a bead in the database."""
    if not isinstance(raw, str):
        return "expected a string"
    target = unwrap_external(raw.strip())
    if not target.strip():
        return "must not be empty"
    if len(target) > BEAD_ID_MAX:
        return f"is {len(target)} characters long (at most {BEAD_ID_MAX})"
    if len(raw) > RAW_TARGET_MAX:
        return f"is {len(raw)} characters long (at most {RAW_TARGET_MAX})"
    return _control_problem(raw)


def rig_name_from_path(path: str | None) -> str | None:
    """A route's rig: the first component of its path; None for the town level ('.')."""
    path = (path or "").strip()
    if path in ("", "."):
        return None
    parts = [part for part in path.strip("/").split("/") if part not in ("", ".")]  # './x' is x
    return parts[0] if parts else None


# URLs: an id is one path segment. '~', '/' and an all-dots id (which a row from an older
# database or a dependency target may hold) are escaped as '~XX', so every id reverses and
# resolves to itself; ids the rule accepts contain none of them, so their URLs are plain.
URL_UNESCAPE = re.compile("~(7E|2F|2E)")
URL_SAFE = "!$&'()*+,;=~:@"  # what Django's reverse() leaves unquoted in a segment


def to_url_segment(value: str) -> str:
    if value and not value.strip("."):
        return "~2E" * len(value)
    return value.replace("~", "~7E").replace("/", "~2F")


def from_url_segment(segment: str) -> str:
    return URL_UNESCAPE.sub(lambda match: chr(int(match[1], 16)), segment)


def quoted_url_segment(value: str) -> str:
    """The id as reverse() writes it in a path, for code that fills one reversed URL with
    thousands of ids."""
    if PLAIN_ID.fullmatch(value):
        return value
    return quote(to_url_segment(value), safe=URL_SAFE)


def group_name(kind: str, key: object) -> str:
    """The channel-layer group of one topic, e.g. `bead.<hash of the bead id>`.

    Channel layers accept only ASCII letters, digits, `-`, `_` and `.` in names shorter than
    100 characters, while ids may hold any character and be long: the raw key never appears
    in a name, so no id can make a send raise. 128 bits of BLAKE2b make a collision (which
    would only send one topic's events to the other's subscribers) practically impossible."""
    digest = hashlib.blake2b(str(key).encode("utf-8", "surrogatepass"), digest_size=16)
    return f"{kind}.{digest.hexdigest()}"
