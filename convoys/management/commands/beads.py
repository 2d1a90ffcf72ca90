"""`manage.py beads import|export|sync|show|create|update|close|reopen|dep|list|search|ready|
heartbeat|log|retry|skip|release|reassign|merge`."""

import argparse
import time
from argparse import ArgumentParser
from typing import Any

import orjson

from convoys.core.formatting import terminal_safe
from convoys.management.base import ServiceCommand, error
from convoys.models import Bead, Dependency, TrackedBead
from convoys.read import bead_page, pages, search, summaries
from convoys.rules import breaker, causes
from convoys.services import actions, bdsync, jsonl, merges
from convoys.services import beads as bead_service

ACTION_HELP = {
    "retry": "clear the breaker of failed or parked beads: they are dispatched again",
    "skip": "close beads as not needed: done for their dependents, counted as skipped",
    "release": "take beads back from their workers: ready again (the worker is told)",
    "reassign": "move beads to another rig (--rig) or worker (--worker)",
    "reopen": "reopen closed or skipped beads",
}
ACTION_MARKS = {"retry": "↻", "skip": "⤼", "release": "↩", "reassign": "→", "reopen": "↺"}
ACTIONS_DESCRIPTION = (
    "Each bead is changed in its own transaction (a refusal leaves the others applied), "
    "then the convoys they belong to are fed once. --dry-run shows what would happen."
)


class Command(ServiceCommand):
    help = "Work with beads: import/export bd JSONL, show, create, update, close, reopen, ready."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        p = sub.add_parser("import", help="import a bd JSONL export (all or nothing)")
        p.add_argument("file")
        p.add_argument("--routes", help="a routes.jsonl mapping prefixes to rigs")
        self.add_json(p)
        p = sub.add_parser("sync", help="mirror a bd JSONL file or `cmd:<command>` (changes only)")
        p.add_argument(
            "source", nargs="?", help="a bd JSONL file, or cmd:<command line> printing one"
        )
        p.add_argument("--once", action="store_true", help="one pass (the default)")
        p.add_argument("--every", type=float, metavar="SECONDS", help="a pass every SECONDS")
        p.add_argument("--routes", help="a routes.jsonl mapping prefixes to rigs")
        p.add_argument(
            "--forget",
            metavar="SOURCE",
            help="forget a source no longer in CONVOY_SYNC_SOURCES: its records become local",
        )
        p.add_argument(
            "--force",
            action="store_true",
            help="with --forget: forget a source even if a pass synced it recently",
        )
        self.add_json(p)
        p = sub.add_parser("export", help="write bd-compatible JSONL")
        p.add_argument("-o", "--output", help="file to write (default: stdout)")
        p = sub.add_parser("show", help="show one bead")
        p.add_argument("id")
        self.add_json(p)
        p = sub.add_parser("create", help="create a bead")
        p.add_argument("title")
        p.add_argument("--id", dest="bead_id")
        p.add_argument("--prefix", default="bd-")
        p.add_argument("--type", dest="issue_type", default="task")
        p.add_argument("--priority", type=int, default=2)
        p.add_argument("--description", default="")
        p.add_argument("--assignee", default="")
        self.add_json(p)
        p = sub.add_parser("update", help="change status, assignee or priority")
        p.add_argument("id")
        p.add_argument("--status")
        p.add_argument("--assignee")
        p.add_argument("--priority", type=int)
        p.add_argument("--title")
        p.add_argument(
            "--force", action="store_true", help="with --status closed: though blockers are open"
        )
        self.add_json(p)
        p = sub.add_parser("close", help="close a bead")
        p.add_argument("id")
        p.add_argument("--reason", default="")
        p.add_argument(
            "--force", action="store_true", help="close it though its blockers are not done"
        )
        self.add_json(p)
        p = sub.add_parser("dep", help="add or remove a dependency")
        dep = p.add_subparsers(dest="dep_action", required=True)
        d = dep.add_parser("add", help="ISSUE depends on TARGET")
        d.add_argument("issue")
        d.add_argument("target")
        d.add_argument("--type", default="blocks")
        d = dep.add_parser("remove")
        d.add_argument("issue")
        d.add_argument("target")
        p = sub.add_parser("list", help="beads by id, filtered (what the API's list gives)")
        p.add_argument("--status")
        p.add_argument("--rig")
        p.add_argument("--assignee", help="a worker name or its prefix (e.g. gastown/)")
        p.add_argument("-q", "--query", help="part of the id or title")
        p.add_argument("--limit", type=int, default=100)
        self.add_json(p)
        p = sub.add_parser(
            "search", help="beads, epics, convoys and rigs by id prefix, title, label, people"
        )
        p.add_argument("text", nargs="+", help="plain words; an id matches by prefix")
        p.add_argument("--limit", type=int, default=20)
        self.add_json(p)
        p = sub.add_parser("ready", help="beads ready to dispatch, by priority then id")
        p.add_argument("--rig")
        p.add_argument("--limit", type=int, default=100)
        self.add_json(p)
        p = sub.add_parser("heartbeat", help="report that a worker is alive")
        p.add_argument("worker")
        p = sub.add_parser("log", help="print a bead's log (its worker's own lines)")
        p.add_argument("id")
        p.add_argument("--follow", "-f", action="store_true", help="print new lines until Ctrl-C")
        p.add_argument("--every", type=float, default=1.0, help="seconds between polls (1)")
        p.add_argument("--for", dest="seconds", type=float, default=None, help=argparse.SUPPRESS)
        for name, text in ACTION_HELP.items():
            p = sub.add_parser(name, help=text, description=ACTIONS_DESCRIPTION)
            p.add_argument("ids", nargs="+", metavar="ID")
            p.add_argument("--reason", default="", help="why (kept in the bead's history)")
            p.add_argument(
                "--dry-run", action="store_true", help="say what it would do; change nothing"
            )
            p.add_argument("--actor", default="cli", help="who does it (default: cli)")
            if name == "reassign":
                p.add_argument("--rig", default="", help="to this rig")
                p.add_argument("--worker", default="", help="to this worker")
            self.add_json(p)
        p = sub.add_parser(
            "merge",
            help="report a bead's change: open (submitted), merged or abandoned",
            description="Under a convoy merging by mr a closed bead is done once merged.",
        )
        p.add_argument("id")
        p.add_argument("state", choices=merges.STATES)
        p.add_argument("--ref", default="", help="the commit or change, e.g. 'PR #12'")
        p.add_argument("--link", default="", help="the change's address")
        p.add_argument("--branch", default="")
        p.add_argument("--target", default="")
        p.add_argument("--ci", default="", help="the change's CI state")
        p.add_argument("--reason", default="", help="why it was abandoned")
        p.add_argument("--actor", default="cli", help="who reports it (default: cli)")
        self.add_json(p)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        getattr(self, "do_" + action)(**options)

    def do_import(self, file: str, routes: str | None, json: bool, **_: Any) -> None:
        report = jsonl.import_file(file, routes_path=routes)
        if json:
            self.write_json(report.as_dict())
            return
        self.stdout.write(
            f"Imported {file}: {report.beads} beads ({report.beads_created} new, "
            f"{report.beads_updated} updated, {report.beads_unchanged} unchanged), "
            f"{report.convoys} convoys, {report.dependencies} dependencies, "
            f"{report.tracked} tracked"
        )
        skipped = report.skipped_tombstones + report.skipped_wisps + report.skipped_memories
        if skipped:
            self.stdout.write(
                f"  skipped {report.skipped_tombstones} tombstones, {report.skipped_wisps} "
                f"wisps, {report.skipped_memories} memories without a key or a value"
            )
        if report.memories:
            self.stdout.write(f"  {report.memories} memories (kept for the export)")
        if report.routes:
            self.stdout.write(f"  {report.routes} routes")
        for warning in report.warnings:
            self.stdout.write(f"  warning: {warning}")

    def do_sync(
        self,
        source: str | None,
        once: bool,
        every: float | None,
        routes: str | None,
        forget: str | None,
        force: bool,
        json: bool,
        **_: Any,
    ) -> None:
        if forget is not None:
            if source is not None or every is not None or once or routes:
                raise error("--forget SOURCE takes no other source, --once, --every or --routes")
            self._forget(forget, json, force)
            return
        if force:
            raise error("--force goes with --forget SOURCE")
        if source is None:
            raise error("sync needs a SOURCE (or --forget SOURCE)")
        if every is not None and (once or every <= 0):
            raise error("--every needs a positive number of seconds, without --once")
        try:
            self._sync_passes(source, every, routes, json)
        except KeyboardInterrupt:  # Ctrl-C between or during passes: a pass is one transaction
            self.stderr.write("sync stopped")

    def _sync_passes(
        self, source: str, every: float | None, routes: str | None, json: bool
    ) -> None:
        failing, first = False, True
        # quiet: the errors and conflicts are printed here, once, not logged as well
        for _, result in bdsync.passes([bdsync.source_for(source)], routes, every, quiet=True):
            shown, first = first, False  # the first pass is always shown
            if isinstance(result, bdsync.SyncFailed):
                if every is None:
                    raise error(str(result))
                if not failing:  # once per failure streak
                    self.stderr.write(f"error: {result}")
                failing = True
                continue
            failing = False
            if result is None:
                self.stderr.write(f"{source}: another process is syncing it; skipped")
            elif json:
                self.stdout.write(orjson.dumps(result.as_dict()).decode())
            elif shown or result.changed or result.taken or result.events:
                # with --every, a pass that changed nothing prints nothing
                self.stdout.write(
                    f"Synced {result.source}: {result.records} records, {result.created} new, "
                    f"{result.updated} updated, {result.missing} missing, {result.returned} "
                    f"back, {result.events} events in {result.seconds:.2f} s"
                )
                for owner, count in result.taken_from.items():
                    self.stdout.write(f"  took {count} records from {owner}")
                if result.conflicts:
                    more = ", …" if result.conflicts > len(result.conflict_ids) else ""
                    self.stdout.write(
                        f"  {result.conflicts} local beads with the same id: not taken "
                        f"({', '.join(result.conflict_ids)}{more})"
                    )

    def _forget(self, source: str, json: bool, force: bool) -> None:
        records, events = bdsync.forget(
            source, actor="cli", force=force
        )  # a refusal: one line, status 1
        if json:
            self.write_json({"forgotten": source.strip(), "records": records, "events": events})
        else:
            self.stdout.write(f"Forgot {source.strip()}: its {records} records are local now")

    def do_export(self, output: str | None, **_: Any) -> None:
        if output:
            with open(output, "w", encoding="utf-8") as stream:
                count = jsonl.export_to(stream)
            self.stderr.write(f"Exported {count} records to {output}")
        else:
            jsonl.export_to(self.stdout)  # type: ignore[arg-type]  # Django's OutputWrapper writes text as a TextIO does

    def do_show(self, id: str, json: bool, **_: Any) -> None:
        bead = bead_service.get_bead(id)
        record = jsonl.bead_record(bead)
        outgoing = list(bead.dependencies.all())
        incoming = list(Dependency.objects.filter(depends_on_id=bead.id).order_by("issue_id"))
        statuses = dict(
            Bead.objects.filter(
                pk__in=[d.depends_on_id for d in outgoing] + [d.issue_id for d in incoming]
            ).values_list("id", "status")
        )
        convoys = list(
            TrackedBead.objects.filter(bead_id=bead.id).values_list("convoy_id", flat=True)
        )
        state = bead_page.bead_state(bead)  # as the bead page and the API say
        blockers, ready = state.blocked_by, state.ready
        origin = bead.sourced
        if json:
            record.update(
                source=origin.source if origin else None,
                missing_from_source=bool(origin and origin.missing_since),
                dispatch_failures=bead.dispatch_failures,
                parked=breaker.is_parked(bead),
                rig=bead.rig_id,
                ready=ready,
                blocked_by=blockers,
                cause=causes.jsonable(state.cause),
                convoys=convoys,
                attempts=[a.as_json() for a in bead_page.attempts(bead.id)],
                dependents=[
                    {
                        "id": d.issue_id,
                        "type": d.type,
                        "status": statuses.get(d.issue_id, "unknown"),
                    }
                    for d in incoming
                ],
            )
            self.write_json(record)
            return
        self.stdout.write(f"{bead.symbol} {bead.id} [{bead.issue_type or 'task'}] {bead.title}")
        self.stdout.write(
            f"  status: {bead.status}   priority: P{bead.priority}   rig: {bead.rig_id or '-'}"
            f"   assignee: {bead.assignee or '-'}   ready: {'yes' if ready else 'no'}"
        )
        if state.cause is not None:
            self.stdout.write(f"  why: {causes.word(state.cause['kind'])}: {state.cause['text']}")
        if bead.labels:
            self.stdout.write(f"  labels: {', '.join(bead.labels)}")
        if bead.close_reason:
            self.stdout.write(f"  close reason: {bead.close_reason}")
        if origin and origin.missing_since:
            since = origin.missing_since.strftime("%Y-%m-%d %H:%M UTC")
            self.stdout.write(f"  source: {origin.source} (missing from its source since {since})")
        elif origin:
            self.stdout.write(f"  source: {origin.source} (change it in bd)")
        if breaker.is_parked(bead):
            self.stdout.write(
                f"  ⚠ parked: {bead.dispatch_failures} failed dispatches in a row (last: "
                f"{breaker.last_error(bead)}); `beads retry {bead.id}` clears it"
            )
        if blockers:
            self.stdout.write(f"  blocked by: {', '.join(blockers)}")
        for title, deps, key in (
            ("depends on", outgoing, "depends_on_id"),
            ("dependents", incoming, "issue_id"),
        ):
            if deps:
                self.stdout.write(f"  {title}:")
                for dep in deps:
                    other = getattr(dep, key)
                    self.stdout.write(
                        f"    {dep.type:<18} {other} ({statuses.get(other, 'not in database')})"
                    )
        if convoys:
            self.stdout.write(f"  tracked by: {', '.join(convoys)}")
        tried = bead_page.attempts(bead.id)
        if tried:
            self.stdout.write(f"  dispatch attempts ({len(tried)}, newest first):")
            for a in tried:
                self.stdout.write(f"    {attempt_line(a)}")

    def do_log(self, id: str, follow: bool, every: float, seconds: float | None, **_: Any) -> None:
        bead_service.get_bead(id)  # a one-line error for an unknown bead
        if not 0 < every <= 3600:
            raise error(f"--every: seconds between polls, above 0 and at most 3600 ({every} given)")
        after = 0
        stop = None if seconds is None else time.monotonic() + seconds
        try:
            while True:
                for line in bead_page.log_after(id, after):
                    self.stdout.write(terminal_safe(line.text))
                    after = line.pk
                self.stdout.flush()
                if not follow or (stop is not None and time.monotonic() >= stop):
                    return
                time.sleep(max(every, 0.05))
        except KeyboardInterrupt:
            return

    def do_create(
        self,
        title: str,
        bead_id: str | None,
        prefix: str,
        issue_type: str,
        priority: int,
        description: str,
        assignee: str,
        json: bool,
        **_: Any,
    ) -> None:
        bead = bead_service.create_bead(
            title,
            bead_id=bead_id,
            prefix=prefix,
            issue_type=issue_type,
            priority=priority,
            description=description,
            assignee=assignee,
            actor="cli",
        )
        self._done(bead, json, "Created")

    def do_update(
        self,
        id: str,
        status: str | None,
        assignee: str | None,
        priority: int | None,
        title: str | None,
        force: bool,
        json: bool,
        **_: Any,
    ) -> None:
        fields: dict[str, Any] = {
            k: v
            for k, v in dict(
                status=status, assignee=assignee, priority=priority, title=title
            ).items()
            if v is not None
        }
        if not fields:
            raise error("nothing to update: give --status, --assignee, --priority or --title")
        self._done(
            bead_service.update_bead(id, actor="cli", force=force, **fields), json, "Updated"
        )

    def do_close(self, id: str, reason: str, force: bool, json: bool, **_: Any) -> None:
        bead = bead_service.close_bead(id, reason=reason, actor="cli", force=force)
        self._done(bead, json, "Closed")

    def _done(self, bead: Bead, json: bool, verb: str) -> None:
        if json:
            self.write_json(jsonl.bead_record(bead))
        else:
            self.stdout.write(f"{verb} {bead.id}: {bead.title} [{bead.status}]")

    def do_dep(
        self, dep_action: str, issue: str, target: str, type: str = "blocks", **_: Any
    ) -> None:
        if dep_action == "add":
            dep = bead_service.add_dependency(issue, target, type, actor="cli")
            self.stdout.write(f"Added {dep}")
        else:
            bead_service.remove_dependency(issue, target, actor="cli")
            self.stdout.write(f"Removed dependency {issue} -> {target}")

    def do_list(
        self,
        status: str | None,
        rig: str | None,
        assignee: str | None,
        query: str | None,
        limit: int,
        json: bool,
        **_: Any,
    ) -> None:
        if limit < 1:
            raise error("--limit must be at least 1")
        found = pages.find_beads(status=status, rig=rig, assignee=assignee, q=query, limit=limit)
        self._beads(found, json, "No beads match.", with_status=True)

    def do_search(self, text: list[str], limit: int, json: bool, **_: Any) -> None:
        if not 1 <= limit <= search.MAX_LIMIT:
            raise error(f"--limit must be 1 to {search.MAX_LIMIT}")
        found = search.search(" ".join(text), limit=limit)
        if json:
            self.write_json({"total": found.total, "hits": [h.as_json() for h in found.hits]})
            return
        if not found.hits:
            self.stdout.write("Nothing matches.")
            return
        for hit in found.hits:
            self.stdout.write(f"{hit.kind:7} {hit.id}  {hit.title}  ({hit.status})")
        if found.total > len(found.hits):
            more = f"more than {found.more_than:,}" if found.more_than else f"{found.total:,}"
            self.stdout.write(f"{len(found.hits)} of {more} matches (--limit for more).")

    def do_ready(self, rig: str | None, limit: int, json: bool, **_: Any) -> None:
        self._beads(pages.find_beads(rig=rig, ready=True, limit=limit), json, "No ready beads.")

    def _beads(self, beads: list[Bead], json: bool, none: str, with_status: bool = False) -> None:
        if json:
            self.write_json(
                [
                    {
                        "id": b.id,
                        "title": b.title,
                        "priority": b.priority,
                        "issue_type": b.issue_type,
                        "rig": b.rig_id,
                        **({"status": b.status, "assignee": b.assignee} if with_status else {}),
                    }
                    for b in beads
                ]
            )
            return
        if not beads:
            self.stdout.write(none)
        for b in beads:
            state = f"{b.status:<12} " if with_status else ""
            who = f"  {b.assignee}" if with_status and b.assignee else ""
            self.stdout.write(
                f"{b.id:<16} {state}P{b.priority}  {b.rig_id or '-':<14} {b.title}{who}"
            )

    def do_heartbeat(self, worker: str, **_: Any) -> None:
        beat = bead_service.heartbeat(worker)
        self.stdout.write(f"♥ {worker} at {beat.at.isoformat()}")
        for bead_id in beat.confirmed:
            self.stdout.write(f"  confirmed the dispatch of {bead_id}")

    def do_merge(self, id: str, state: str, actor: str, json: bool, **options: Any) -> None:
        change = merges.Change(state, "cli", **{name: options[name] for name in merges.FIELDS})
        changed = merges.record(id, change, actor=actor)
        if json:
            self.write_json({"id": id, "changed": changed, "merge": summaries.merge_of(id)})
            return
        words = {
            "open": "submitted, waiting to merge",
            "merged": "merged",
            "abandoned": "abandoned",
        }
        if changed:
            self.stdout.write(f"{id}: {words[state]}")
        else:
            self.stdout.write(f"{id}: already {words[state]}, nothing changed")

    def do_retry(self, **options: Any) -> None:
        self._act("retry", **options)

    def do_skip(self, **options: Any) -> None:
        self._act("skip", **options)

    def do_release(self, **options: Any) -> None:
        self._act("release", **options)

    def do_reassign(self, **options: Any) -> None:
        self._act("reassign", **options)

    def do_reopen(self, **options: Any) -> None:
        self._act("reopen", **options)

    def _act(
        self,
        action: str,
        ids: list[str],
        reason: str,
        dry_run: bool,
        actor: str,
        json: bool,
        rig: str = "",
        worker: str = "",
        **_: Any,
    ) -> None:
        """One action on the beads `ids`: a line per bead and the summary; exit status 1
        when any was refused (the others are applied all the same)."""
        batch = actions.run(
            action, ids, actor=actor, reason=reason, dry_run=dry_run, rig=rig, worker=worker
        )
        if json:
            self.write_json(batch.as_json())
        else:
            if dry_run:
                self.stdout.write("Dry run: nothing is changed.")
            for outcome in batch.outcomes:
                mark = ACTION_MARKS[action] if outcome.ok else "✗"
                words = outcome.words if outcome.ok else f"refused: {outcome.words}"
                told = f" ({outcome.told})" if outcome.told else ""
                self.stdout.write(f"{mark} {outcome.id}: {words}{told}")
            if batch.fed:
                self.stdout.write(f"  dispatched {', '.join(batch.fed)}")
            self.stdout.write(batch.summary)
        if batch.refused:
            raise error(batch.summary)


def attempt_line(a: bead_page.Attempt) -> str:
    """One dispatch attempt in a line: #, when, path, rig, worker, how long, outcome."""
    took = f"{a.duration_ms:.0f} ms" if a.duration_ms is not None else "-"
    marks = (" (retry)" if a.retry else "") + (" (forced)" if a.forced else "")
    error = f": {terminal_safe(a.error.splitlines()[0][:120])}" if a.error.strip() else ""
    return (
        f"#{a.number} {a.at:%Y-%m-%d %H:%M:%S} {a.path_words}{marks}  rig {a.rig or '-'}  "
        f"worker {a.worker or '-'}  {took}  {a.outcome_words}{error}"
    )
