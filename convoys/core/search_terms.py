"""What a search box's text means to the index: plain words, never query syntax.

The text is cut into terms at white space and each term into its runs of letters and digits
("gt-a" -> ["gt", "a"]), the way the index cuts ids, titles and labels. A term matches those
words in a row, the last one by prefix ("gt-a" finds "gt-abc", "deplo" finds "deploy"); every
term must match. Quotes, `*`, `:`, `(`, `NEAR`, `&`, `!` are never operators: nothing a person
types can make the query fail. Long text is cut (only its first terms count).
"""

import re

MAX_TERMS = 8
MAX_TERM_WORDS = 6
MAX_WORD = 64  # characters of a word that count (PostgreSQL refuses lexemes over 2 kB)
MAX_TEXT = 500

_WORD = re.compile(r"[^\W_]+")


def terms(text: str) -> list[list[str]]:
    """The terms of `text`, each a list of lowercase words; [] when it has none."""
    found = []
    for term in (text or "")[:MAX_TEXT].split():
        words = [w[:MAX_WORD].lower() for w in _WORD.findall(term)][:MAX_TERM_WORDS]
        if words:
            found.append(words)
        if len(found) == MAX_TERMS:
            break
    return found


def fts5_match(found: list[list[str]]) -> str:
    """An SQLite FTS5 MATCH expression: one quoted phrase per term, prefix on its last word."""
    return " ".join('"' + " ".join(words) + '"*' for words in found)


def tsquery(found: list[list[str]]) -> str:
    """A PostgreSQL to_tsquery text: words of a term joined by <->, terms by &."""
    return " & ".join(" <-> ".join(words) + ":*" for words in found)
