"""Finding beads, epics, convoys and rigs by what a person types: the search page, the command
palette (through /api/search) and tools.

Beads (id, title, labels, assignee and owner, description) and convoys (id, title, labels,
owner) are read from the index the database keeps with triggers (migration 0027_search: FTS5
on SQLite, a tsvector with a GIN index on PostgreSQL), so every write path keeps it true. The
text becomes plain terms (convoys/core/search_terms.py); ranked by the index's relevance (ids
first, then titles, labels and people, then descriptions), an exact id ahead of all. Rigs are
few and matched by name.
"""

from typing import NamedTuple

from django.db import connection
from django.urls import reverse

from convoys.core import search_terms
from convoys.core.ids import text_problem
from convoys.models import CONVOY_OPEN, Bead, Convoy, Rig

PAGE = 20
MAX_LIMIT = 100
# Matches are counted up to this many (counting 50,000 costs what ranking them does); pages
# go as far.
COUNT_CAP = 1000
MAX_OFFSET = COUNT_CAP

_SQLITE = {
    "hits": (
        "SELECT k.kind, k.key FROM convoys_search s JOIN convoys_search_key k ON k.id = s.rowid "
        "WHERE convoys_search MATCH %s "
        "ORDER BY bm25(convoys_search, 10.0, 4.0, 2.0, 2.0, 1.0), k.key LIMIT %s OFFSET %s"
    ),
    "count": (
        "SELECT count(*) FROM (SELECT 1 FROM convoys_search WHERE convoys_search MATCH %s LIMIT %s)"
    ),
}
_POSTGRES = {
    "hits": (
        "SELECT kind, key FROM convoys_search, to_tsquery('simple', %s) q WHERE doc @@ q "
        "ORDER BY ts_rank(doc, q) DESC, key LIMIT %s OFFSET %s"
    ),
    "count": (
        "SELECT count(*) FROM (SELECT 1 FROM convoys_search "
        "WHERE doc @@ to_tsquery('simple', %s) LIMIT %s) found"
    ),
}


class Hit(NamedTuple):
    kind: str  # "bead", "epic", "convoy" or "rig"
    id: str
    title: str
    status: str
    url: str

    def as_json(self) -> dict[str, str]:
        return self._asdict()


class Found(NamedTuple):
    q: str
    hits: list[Hit]
    total: int  # index matches in all (rigs aside), counted up to COUNT_CAP + 1
    offset: int
    limit: int

    @property
    def next_offset(self) -> int | None:
        end = self.offset + self.limit
        return end if end < self.total and end < MAX_OFFSET else None

    @property
    def more_than(self) -> int | None:
        """How many were counted when there are more matches than that, else None."""
        return COUNT_CAP if self.total > COUNT_CAP else None

    @property
    def previous_offset(self) -> int | None:
        return max(0, self.offset - self.limit) if self.offset else None


def _statements() -> tuple[dict[str, str], str] | None:
    if connection.vendor == "sqlite":
        return _SQLITE, "sqlite"
    if connection.vendor == "postgresql":
        return _POSTGRES, "postgresql"
    return None


def search(text: str, *, limit: int = PAGE, offset: int = 0, count: bool = True) -> Found:
    """The hits for `text`, best first, `limit` of them from `offset`. Never raises for any
    text: what is not a word is ignored, and text without words finds nothing."""
    limit = max(1, min(limit, MAX_LIMIT))
    offset = max(0, min(offset, MAX_OFFSET))
    found = search_terms.terms(text)
    statements = _statements()
    if not found or statements is None:
        return Found(text, [], 0, offset, limit)
    sql, vendor = statements
    query = search_terms.fts5_match(found) if vendor == "sqlite" else search_terms.tsquery(found)
    with connection.cursor() as cursor:
        cursor.execute(sql["hits"], [query, limit, offset])
        keys = [(kind, key) for kind, key in cursor.fetchall()]
        total = len(keys) + offset
        if count and (len(keys) == limit or offset):
            cursor.execute(sql["count"], [query, COUNT_CAP + 1])
            total = cursor.fetchone()[0]
    hits = _hydrate(keys)
    exact = text.strip()
    if offset == 0 and exact:
        hits = _exact_first(exact, hits)
        if len(found) == 1:
            hits = _rigs(exact) + hits
    return Found(text, hits, total, offset, limit)


def _hydrate(keys: list[tuple[str, str]]) -> list[Hit]:
    """Hits in `keys`' order from the rows (a key whose row is gone is left out)."""
    bead_ids = [key for kind, key in keys if kind == "bead"]
    convoy_ids = [key for kind, key in keys if kind == "convoy"]
    beads = Bead.objects.only("id", "title", "status", "issue_type").in_bulk(bead_ids)
    convoys = Convoy.objects.only("id", "title", "status", "close_reason", "paused_at").in_bulk(
        convoy_ids
    )
    hits = []
    for kind, key in keys:
        if kind == "bead" and key in beads:
            hits.append(_bead_hit(beads[key]))
        elif kind == "convoy" and key in convoys:
            hits.append(_convoy_hit(convoys[key]))
    return hits


def _bead_hit(bead: Bead) -> Hit:
    kind = "epic" if bead.issue_type == "epic" else "bead"
    return Hit(kind, bead.pk, bead.title, bead.status, reverse("bead", args=[bead.pk]))


def _convoy_hit(convoy: Convoy) -> Hit:
    """Its state for people, "paused" for an open convoy that is."""
    state = "paused" if convoy.paused_at and convoy.status == CONVOY_OPEN else convoy.state
    return Hit("convoy", convoy.pk, convoy.title, state, reverse("convoy", args=[convoy.pk]))


def _exact_first(text: str, hits: list[Hit]) -> list[Hit]:
    """The bead or convoy whose id is `text` exactly, ahead of the others."""
    if len(text) > 255 or text_problem(text):  # no row holds it
        return hits
    exact: list[Hit] = []
    bead = Bead.objects.filter(pk=text).first()
    if bead is not None:
        exact.append(_bead_hit(bead))
    convoy = Convoy.objects.filter(pk=text).first() if len(text) <= 64 else None
    if convoy is not None:
        exact.append(_convoy_hit(convoy))
    ids = {(h.kind, h.id) for h in exact}
    return exact + [h for h in hits if (h.kind, h.id) not in ids]


def _rigs(text: str) -> list[Hit]:
    if len(text) > 100 or text_problem(text):
        return []
    rigs = Rig.objects.filter(name__istartswith=text).order_by("name")[:5]
    return [
        Hit("rig", r.name, r.name, r.state, reverse("dashboard") + "#capacity-panel") for r in rigs
    ]
