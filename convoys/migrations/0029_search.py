"""The search index over beads and convoys, kept by database triggers so that every write path
(the ORM, the importer's multi-row INSERT and COPY, raw UPDATEs, deletes and flushes) keeps it
true without knowing of it.

SQLite: an FTS5 table `convoys_search` (columns ids, title, labels, people, description) whose
rowid is the id of `convoys_search_key` (kind, key): a stable INTEGER PRIMARY KEY, so a trigger
finds a bead's index row through a B-tree lookup and never by scanning the index.

PostgreSQL: a table `convoys_search` (kind, key, doc tsvector) with a GIN index on doc. Text is
reduced to its letters and digits before `to_tsvector('simple', …)`, as the query side does
(convoys/core/search_terms.py), so "gt-abc" is the words "gt abc" on both sides. A TRUNCATE
of beads or convoys (Django's flush) empties their part of the index.
"""

from django.db import migrations

SQLITE_TEXT = {
    "bead": (
        "NEW.id, NEW.title, NEW.labels, NEW.assignee || ' ' || NEW.owner, NEW.description",
        "id, title, labels, assignee, owner, description",
    ),
    "convoy": ("NEW.id, NEW.title, NEW.labels, NEW.owner, ''", "id, title, labels, owner"),
}


def _sqlite_forward(cursor):
    cursor.execute(
        "CREATE TABLE convoys_search_key (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, "
        "key TEXT NOT NULL, UNIQUE (kind, key))"
    )
    cursor.execute(
        "CREATE VIRTUAL TABLE convoys_search USING fts5("
        "ids, title, labels, people, description, tokenize = 'unicode61 remove_diacritics 2')"
    )
    for kind, (values, columns) in SQLITE_TEXT.items():
        table = f"convoys_{kind}"
        row = f"(SELECT id FROM convoys_search_key WHERE kind = '{kind}' AND key = {{}}.id)"
        drop = (
            f"DELETE FROM convoys_search WHERE rowid = {row.format('OLD')};\n"
            f"  DELETE FROM convoys_search_key WHERE kind = '{kind}' AND key = OLD.id;"
        )
        add = (
            f"INSERT OR IGNORE INTO convoys_search_key (kind, key) VALUES ('{kind}', NEW.id);\n"
            f"  DELETE FROM convoys_search WHERE rowid = {row.format('NEW')};\n"
            "  INSERT INTO convoys_search (rowid, ids, title, labels, people, description)\n"
            f"  VALUES ({row.format('NEW')}, {values});"
        )
        changed = " OR ".join(f"OLD.{c.strip()} IS NOT NEW.{c.strip()}" for c in columns.split(","))
        cursor.execute(
            f"CREATE TRIGGER {table}_search_insert AFTER INSERT ON {table} BEGIN\n  {add}\nEND"
        )
        cursor.execute(
            f"CREATE TRIGGER {table}_search_update AFTER UPDATE OF {columns} ON {table} "
            f"WHEN {changed} BEGIN\n  {drop}\n  {add}\nEND"
        )
        cursor.execute(
            f"CREATE TRIGGER {table}_search_delete AFTER DELETE ON {table} BEGIN\n  {drop}\nEND"
        )
        cursor.execute(
            f"INSERT INTO convoys_search_key (kind, key) SELECT '{kind}', id FROM {table}"
        )
        cursor.execute(
            "INSERT INTO convoys_search (rowid, ids, title, labels, people, description) "
            f"SELECT k.id, {values.replace('NEW.', 't.')} FROM {table} t "
            f"JOIN convoys_search_key k ON k.kind = '{kind}' AND k.key = t.id"
        )


def _sqlite_backward(cursor):
    for kind in SQLITE_TEXT:
        for event in ("insert", "update", "delete"):
            cursor.execute(f"DROP TRIGGER IF EXISTS convoys_{kind}_search_{event}")
    cursor.execute("DROP TABLE IF EXISTS convoys_search")
    cursor.execute("DROP TABLE IF EXISTS convoys_search_key")


def _words(expression):
    return f"convoys_search_words({expression})"


PEOPLE = "NEW.assignee || ' ' || NEW.owner"
PG_DOC = {
    "bead": (
        f"setweight(to_tsvector('simple', {_words('NEW.id')}), 'A')"
        f" || setweight(to_tsvector('simple', {_words('NEW.title')}), 'B')"
        f" || setweight(to_tsvector('simple', {_words('NEW.labels::text')}), 'C')"
        f" || setweight(to_tsvector('simple', {_words(PEOPLE)}), 'C')"
        f" || setweight(to_tsvector('simple', {_words('NEW.description')}), 'D')",
        "id, title, labels, assignee, owner, description",
    ),
    "convoy": (
        f"setweight(to_tsvector('simple', {_words('NEW.id')}), 'A')"
        f" || setweight(to_tsvector('simple', {_words('NEW.title')}), 'B')"
        f" || setweight(to_tsvector('simple', {_words('NEW.labels::text')}), 'C')"
        f" || setweight(to_tsvector('simple', {_words('NEW.owner')}), 'C')",
        "id, title, labels, owner",
    ),
}


def _pg_forward(cursor):
    cursor.execute(
        "CREATE TABLE convoys_search (kind text NOT NULL, key text NOT NULL, "
        "doc tsvector NOT NULL, PRIMARY KEY (kind, key))"
    )
    cursor.execute("CREATE INDEX convoys_search_doc ON convoys_search USING gin (doc)")
    cursor.execute(
        "CREATE FUNCTION convoys_search_words(text) RETURNS text IMMUTABLE LANGUAGE sql AS "
        "$$ SELECT regexp_replace(coalesce($1, ''), '[^[:alnum:]]+', ' ', 'g') $$"
    )
    for kind, (doc, columns) in PG_DOC.items():
        table = f"convoys_{kind}"
        cursor.execute(
            f"CREATE FUNCTION {table}_search() RETURNS trigger LANGUAGE plpgsql AS $$\n"
            "BEGIN\n"
            "  IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.id IS DISTINCT FROM NEW.id) THEN\n"
            f"    DELETE FROM convoys_search WHERE kind = '{kind}' AND key = OLD.id;\n"
            "  END IF;\n"
            "  IF TG_OP <> 'DELETE' THEN\n"
            f"    INSERT INTO convoys_search (kind, key, doc) VALUES ('{kind}', NEW.id, {doc})\n"
            "    ON CONFLICT (kind, key) DO UPDATE SET doc = EXCLUDED.doc;\n"
            "  END IF;\n"
            "  RETURN NULL;\n"
            "END $$"
        )
        cursor.execute(
            f"CREATE FUNCTION {table}_search_truncate() RETURNS trigger LANGUAGE plpgsql AS $$\n"
            f"BEGIN DELETE FROM convoys_search WHERE kind = '{kind}'; RETURN NULL; END $$"
        )
        changed = " OR ".join(
            f"OLD.{c.strip()} IS DISTINCT FROM NEW.{c.strip()}" for c in columns.split(",")
        )
        cursor.execute(
            f"CREATE TRIGGER {table}_search_change AFTER INSERT OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {table}_search()"
        )
        cursor.execute(
            f"CREATE TRIGGER {table}_search_update AFTER UPDATE OF {columns} ON {table} "
            f"FOR EACH ROW WHEN ({changed}) EXECUTE FUNCTION {table}_search()"
        )
        cursor.execute(
            f"CREATE TRIGGER {table}_search_truncate AFTER TRUNCATE ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {table}_search_truncate()"
        )
        cursor.execute(
            f"INSERT INTO convoys_search (kind, key, doc) "
            f"SELECT '{kind}', id, {doc.replace('NEW.', 't.')} FROM {table} t"
        )


def _pg_backward(cursor):
    for kind in PG_DOC:
        table = f"convoys_{kind}"
        for trigger in ("change", "update", "truncate"):
            cursor.execute(f"DROP TRIGGER IF EXISTS {table}_search_{trigger} ON {table}")
        cursor.execute(f"DROP FUNCTION IF EXISTS {table}_search()")
        cursor.execute(f"DROP FUNCTION IF EXISTS {table}_search_truncate()")
    cursor.execute("DROP TABLE IF EXISTS convoys_search")
    cursor.execute("DROP FUNCTION IF EXISTS convoys_search_words(text)")


VENDORS = {
    "sqlite": (_sqlite_forward, _sqlite_backward),
    "postgresql": (_pg_forward, _pg_backward),
}


def forward(apps, schema_editor):
    steps = VENDORS.get(schema_editor.connection.vendor)
    if steps:
        with schema_editor.connection.cursor() as cursor:
            steps[0](cursor)


def backward(apps, schema_editor):
    steps = VENDORS.get(schema_editor.connection.vendor)
    if steps:
        with schema_editor.connection.cursor() as cursor:
            steps[1](cursor)


class Migration(migrations.Migration):
    dependencies = [("convoys", "0028_attempts_logs_views")]

    operations = [migrations.RunPython(forward, backward)]
