"""`manage.py convoy create|add|check|status|list|close|land|watch|unwatch|stranded|stage|launch|
pause|resume|ack|capacity|feed|reproject`.

One module, though long: Django names a command by its file, and most of its length is the
argument parser of its subcommands (`add_arguments`); each `do_<subcommand>` method asks a
service or a read model and prints the answer.
"""

import time
from argparse import ArgumentParser
from collections.abc import Mapping
from typing import Any

from django.utils import timezone

from convoys.core import forecast
from convoys.core.formatting import convoy_title, render_launch, status_words
from convoys.management.base import ServiceCommand, error
from convoys.models import CONVOY_OPEN, LANDED_REASON, STAGED_STATUSES, Convoy, status_symbol
from convoys.read import projection, summaries
from convoys.rules import breaker, capacity, causes, forecasting, merging, stranding
from convoys.services import (
    controls,
    deadlines,
    escalation,
    feeding,
    launch,
    staging,
    timekeeping,
)
from convoys.services import convoys as convoy_service
from convoys.services.notify import format_duration

DUE_HELP = "When it should land: an RFC 3339 time with its zone, e.g. 2026-12-24T17:00Z"
MERGE_HELP = (
    "Merge strategy: direct (push to main), mr (merge queue: a closed bead is done once its "
    "change is merged), local (keep on branch); default CONVOY_MERGE_STRATEGY (direct)"
)


class Command(ServiceCommand):
    help = "Track batches of beads: stage, launch, watch, check, close and land convoys."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        p = sub.add_parser(
            "create",
            help="Create a new convoy",
            description="Create a new convoy that tracks the specified issues. The --owner "
            "flag specifies who requested the convoy (receives completion notification by "
            "default); --notify adds additional subscribers beyond the owner.",
        )
        p.add_argument("name", nargs="?", default="")
        p.add_argument("ids", nargs="*")
        p.add_argument(
            "--owner", default="", help="Owner who requested convoy (gets completion notification)"
        )
        p.add_argument(
            "--notify",
            nargs="?",
            const="mayor/",
            default="",
            help="Additional address to notify on completion (default: mayor/ if flag used "
            "without value)",
        )
        p.add_argument(
            "--owned",
            action="store_true",
            help="Mark convoy as caller-managed lifecycle (landed with `convoy land`)",
        )
        p.add_argument("--merge", default="", help=MERGE_HELP)
        p.add_argument("--base-branch", default="", help="Target branch for all convoy work")
        p.add_argument("--molecule", default="", help="Associated molecule ID")
        p.add_argument(
            "--from-epic", default=None, help="Track the epic's slingable leaves (sub-epics walked)"
        )
        p.add_argument(
            "--max-in-flight", type=int, default=None, help="Most tracked beads in progress at once"
        )
        p.add_argument("--due", default=None, help=DUE_HELP)
        self.add_json(p)
        p = sub.add_parser("update", help="Change a convoy's due time, merge strategy or title")
        p.add_argument("convoy")
        due = p.add_mutually_exclusive_group()
        due.add_argument("--due", default=None, help=DUE_HELP)
        due.add_argument("--no-due", action="store_true", help="Remove its due time")
        p.add_argument("--merge", default=None, help=MERGE_HELP)
        p.add_argument("--title", default=None)
        self.add_json(p)
        p = sub.add_parser(
            "add",
            help="Add issues to an existing convoy",
            description="Add issues to an existing convoy. If the convoy is closed, it will be "
            "automatically reopened.",
        )
        p.add_argument("convoy")
        p.add_argument("ids", nargs="+")
        p = sub.add_parser(
            "check",
            help="Check and auto-close completed convoys",
            description="Check convoys and auto-close any where all tracked issues are "
            "complete. Without arguments, checks all open convoys. With a convoy ID, checks "
            "only that convoy.",
        )
        p.add_argument("convoy", nargs="?")
        p.add_argument(
            "--dry-run", action="store_true", help="Preview what would close without acting"
        )
        p = sub.add_parser(
            "status",
            help="Show convoy status",
            description="Show detailed status for a convoy: metadata, tracked issues, and "
            "completion progress. Without an ID, shows status of all active convoys.",
        )
        p.add_argument("convoy", nargs="?")
        self.add_json(p)
        p = sub.add_parser(
            "list",
            help="List convoys",
            description="List convoys, showing open convoys by default.",
        )
        p.add_argument("--all", action="store_true", help="Show all convoys (open and closed)")
        p.add_argument("--status", default=None, help="Filter by status (open, closed, staged_*)")
        p.add_argument("--tree", action="store_true", help="Show convoy + child status tree")
        p.add_argument(
            "--at-risk",
            action="store_true",
            help="Only open convoys whose forecast lands after their due time",
        )
        self.add_json(p)
        p = sub.add_parser(
            "close",
            help="close a convoy",
            description="Close a convoy, optionally with a reason. By default, verifies that "
            "all tracked issues are closed before allowing the close. Use --force to close "
            "regardless of tracked issue status. The close is idempotent - closing an "
            "already-closed convoy is a no-op.",
        )
        p.add_argument("convoy")
        p.add_argument("--reason", default="", help="Reason for closing the convoy")
        p.add_argument(
            "--notify",
            default="",
            metavar="ADDR",
            help="Address to notify on close (a username, an e-mail address or e.g. mayor/)",
        )
        p.add_argument(
            "-f", "--force", action="store_true", help="Close even if tracked issues are still open"
        )
        p = sub.add_parser(
            "land",
            help="land an owned convoy (release workers, close convoy)",
            description="Land an owned convoy: verify it is owned (refuses non-owned "
            "convoys), check all tracked issues are closed (use --force to override), "
            'release their workers, close it with reason "Landed by owner" and send the '
            "completion notifications. Use `convoy close` instead for non-owned convoys.",
        )
        p.add_argument("convoy")
        p.add_argument(
            "-f",
            "--force",
            action="store_true",
            help="Land even if tracked issues are not all closed",
        )
        p.add_argument(
            "--dry-run", action="store_true", help="Show what would happen without acting"
        )
        for name, text in (
            ("watch", "Subscribe to convoy completion notifications"),
            ("unwatch", "Unsubscribe from convoy completion notifications"),
        ):
            p = sub.add_parser(
                name,
                help=text,
                description=(
                    "Subscribe a user to be notified when a convoy completes (all tracked "
                    "issues close), in their inbox (and by e-mail with --email). The user "
                    "needs permission to view convoys, as on the web."
                    if name == "watch"
                    else "Remove a user's subscription to a convoy's completion notification."
                ),
            )
            p.add_argument("convoy", metavar="convoy-id")
            p.add_argument("--user", required=True, help="Username to subscribe or unsubscribe")
            if name == "watch":
                p.add_argument(
                    "--email", action="store_true", help="Also send the notification by e-mail"
                )
            self.add_json(p)
        p = sub.add_parser(
            "stranded",
            help="Find stranded convoys (ready work, stuck, or empty) needing attention",
        )
        p.add_argument(
            "--overdue", action="store_true", help="Only open convoys past their due time"
        )
        self.add_json(p)
        for name in ("stage", "launch"):
            p = sub.add_parser(name, help=f"{name} an epic, a list of beads or a staged convoy")
            p.add_argument("ids", nargs="*")
            p.add_argument("--title", default=None)
            p.add_argument("--force", action="store_true")
            self.add_json(p)
            if name == "stage":
                p.add_argument("--launch", action="store_true")
                p.add_argument("--merge", default="", help=MERGE_HELP)
                p.add_argument("--due", default=None, help=DUE_HELP)
        p = sub.add_parser("pause", help="stop every path from dispatching a convoy's beads")
        p.add_argument("convoy")
        p.add_argument("--reason", default="", help="why (shown on the page and in status)")
        p.add_argument("--actor", default="cli", help="who pauses it (default: cli)")
        self.add_json(p)
        p = sub.add_parser("resume", help="resume a paused convoy and feed it at once")
        p.add_argument("convoy")
        p.add_argument("--actor", default="cli", help="who resumes it (default: cli)")
        self.add_json(p)
        p = sub.add_parser("ack", help="acknowledge a stuck convoy's escalation: no more reminders")
        p.add_argument("convoy")
        p.add_argument("--actor", default="cli", help="who acknowledges it (default: cli)")
        self.add_json(p)
        p = sub.add_parser(
            "capacity", help="the town's beads in flight, its cap, and the queue waiting for it"
        )
        change = p.add_mutually_exclusive_group()
        change.add_argument(
            "--set", default=None, metavar="N", help="cap at N beads in flight now (0: no cap)"
        )
        change.add_argument(
            "--unset", action="store_true", help="back to CONVOY_MAX_IN_FLIGHT's cap"
        )
        p.add_argument("--actor", default="cli", help="who changes it (default: cli)")
        self.add_json(p)
        p = sub.add_parser(
            "feed", help="run one catch-up pass, one stranded scan and the escalation check now"
        )
        p.add_argument("--once", action="store_true", help="(the only mode; for cron and tests)")
        self.add_json(p)
        p = sub.add_parser(
            "reproject",
            help="derive the read model again from the rows alone (every convoy, or these)",
        )
        p.add_argument("ids", nargs="*", metavar="ID", help="convoy ids (default: everything)")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        getattr(self, "do_" + action)(**options)

    # --- create / add -----------------------------------------------------------------------
    def do_create(
        self,
        name: str,
        ids: list[str],
        owner: str,
        notify: str,
        owned: bool,
        merge: str,
        base_branch: str,
        molecule: str,
        from_epic: str | None,
        max_in_flight: int | None,
        json: bool,
        due: str | None = None,
        **_: Any,
    ) -> None:
        convoy = convoy_service.create(
            name,
            ids,
            owner=owner,
            notify=notify,
            owned=owned,
            merge=merge,
            base_branch=base_branch,
            molecule=molecule,
            from_epic=from_epic,
            actor="cli",
            max_in_flight=max_in_flight,
            due=due,
        )
        if json:
            self.write_json(summaries.convoy_status_json(convoy))
            return
        tracked = convoy.tracked.count()
        self.stdout.write(f"✓ Created convoy 🚚 {convoy.id}: {convoy.title}")
        self.stdout.write(f"  Tracking {tracked} issue(s)")
        self.stdout.write(f"  Merge: {merging.strategy(convoy)}")
        if convoy.due_at is not None:
            self.stdout.write(f"  Due: {convoy.due_at:%Y-%m-%d %H:%M} UTC")
        self.stdout.write(
            "  Owned convoy: caller manages lifecycle via convoy land"
            if owned
            else "  Convoy auto-closes when all tracked issues complete"
        )

    def do_add(self, convoy: str, ids: list[str], **_: Any) -> None:
        row, added, reopened = convoy_service.add(convoy, ids, actor="cli")
        if reopened:
            self.stdout.write(f"↺ Reopened convoy {row.id}")
        self.stdout.write(f"✓ Added {len(added)} issue(s) to convoy 🚚 {row.id}")
        if added:
            self.stdout.write(f"  Issues: {', '.join(added)}")

    # --- check / close / land --------------------------------------------------------------
    def do_check(self, convoy: str | None, dry_run: bool, **_: Any) -> None:
        results = convoy_service.check(convoy, dry_run=dry_run)
        if convoy:
            row, closed, info = results[0]
            if row.status == "closed" and not closed:
                self.stdout.write(f"○ Convoy {row.id} is already closed")
            elif closed:
                verb = "⚠ Would auto-close" if dry_run else "✓ Auto-closed"
                self.stdout.write(f"{verb} convoy 🚚 {row.id}: {row.title}")
            else:
                self.stdout.write(f"○ Convoy {row.id} has {_remaining(info)}")
                verdict = stranding.classify_one(row)
                if verdict.kind:  # open: what it waits for (the one stranded rule)
                    self.stdout.write(f"  {verdict.label}: {verdict.reason}")
            return
        landed = [(row, info) for row, was_closed, info in results if was_closed]
        if not landed:
            self.stdout.write("No convoys ready to close.")
            return
        verb = "⚠ Would auto-close" if dry_run else "✓ Auto-closed"
        self.stdout.write(f"{verb} {len(landed)} convoy(s):")
        for row, _info in landed:
            self.stdout.write(f"  🚚 {row.id}: {row.title}")

    def do_close(self, convoy: str, reason: str, notify: str, force: bool, **_: Any) -> None:
        row, changed, still_open = convoy_service.close(
            convoy, reason=reason, force=force, notify=notify
        )
        if not changed:
            self.stdout.write(f"○ Convoy {row.id} is already closed")
            return
        self.stdout.write(f"✓ Closed convoy 🚚 {row.id}: {row.title}")
        if reason:
            self.stdout.write(f"  Reason: {reason}")
        total = row.tracked.count()
        line = f"  Tracked: {total} issue(s) ({total - len(still_open)} closed"
        self.stdout.write(line + (f", {len(still_open)} still open)" if still_open else ")"))

    def do_land(self, convoy: str, force: bool, dry_run: bool, **_: Any) -> None:
        row, changed, released = convoy_service.land(convoy, force=force, dry_run=dry_run)
        if row.status == "closed" and not changed:
            self.stdout.write(f"○ Convoy {row.id} is already closed")
            return
        if dry_run:
            info = convoy_service.progress(convoy_service.tracked_details([row])[row.id])
            self.stdout.write(f"⚠ Dry run — would land convoy 🚚 {row.id}: {row.title}")
            self.stdout.write("")
            self.stdout.write(
                f"  Tracked: {info['total']} issue(s) ({info['done']} closed, "
                f"{info['total'] - info['done']} open)"
            )
            self.stdout.write(f"  Workers to release: {len(released)}")
            for worker in released:
                self.stdout.write(f"    • {worker}")
            self.stdout.write(f"  Close reason: {LANDED_REASON}")
            return
        self.stdout.write(f"✓ Landed convoy 🚚 {row.id}: {row.title}")
        if released:
            self.stdout.write(f"  Released workers: {', '.join(released)}")

    # --- watch / unwatch --------------------------------------------------------------------
    def do_watch(self, convoy: str, user: str, email: bool, json: bool, **_: Any) -> None:
        status = convoy_service.watch(user, convoy, email=email)
        kind = "mail" if email else "inbox"
        if json:
            self.write_json(
                {"convoy_id": convoy, "user": user, "watch_type": kind, "status": status}
            )
        elif status == "already_watching":
            self.stdout.write(f"○ {user} is already watching convoy {convoy} ({kind})")
        else:
            self.stdout.write(
                f"{'📬' if email else '🔔'} {user} subscribed to convoy {convoy} "
                f"({kind} notification)"
            )

    def do_unwatch(self, convoy: str, user: str, json: bool, **_: Any) -> None:
        removed = convoy_service.unwatch(user, convoy)
        if json:
            self.write_json(
                {
                    "convoy_id": convoy,
                    "user": user,
                    "status": "unsubscribed" if removed else "not_watching",
                }
            )
        elif removed:
            self.stdout.write(f"🔕 {user} unsubscribed from convoy {convoy}")
        else:
            self.stdout.write(f"○ {user} is not watching convoy {convoy}")

    # --- status / list / stranded ----------------------------------------------------------
    def do_status(self, convoy: str | None, json: bool, **_: Any) -> None:
        if not convoy:
            rows = list(Convoy.objects.filter(status=CONVOY_OPEN).order_by("id"))
            if json:
                self.write_json([summaries.convoy_status_json(c) for c in rows])
                return
            if not rows:
                self.stdout.write("No open convoys.")
            by_convoy = summaries.convoy_summaries(rows)
            for row in rows:
                s = by_convoy[row.id]
                self.stdout.write(
                    f"🚚 {row.id}: {convoy_title(row.title)}  {s['done']}/{s['total']}"
                )
            return
        row = convoy_service.get_convoy(convoy)
        data = {
            **summaries.convoy_status_json(row),
            "paused": controls.pause_json(row),
            "escalation": escalation.state_json(row),
        }
        if json:
            self.write_json(data)
            return
        self.stdout.write(f"🚚 {row.id}: {convoy_title(row.title)}")
        progress = data["progress"]
        failed = f", {progress['failed']} failed" if progress["failed"] else ""
        waiting = (
            f" · {progress['submitted']} submitted, waiting to merge"
            if progress["submitted"]
            else ""
        ) + (f" · ⤼ {progress['skipped']} skipped" if progress.get("skipped") else "")
        self.stdout.write(
            f"  Status: {status_words(row.state)}   Progress: {data['completed']}/{data['total']}"
            f" done{waiting} ({progress['percentComplete']}%{failed})"
            + (f"   Owner: {row.owner}" if row.owner else "")
            + f"   Merge: {data['merge_strategy']}"
        )
        if data["source"]:
            self.stdout.write(
                f"  Source: {data['source']}"
                + ("   ⚠ missing from its source" if data["missing_from_source"] else "")
            )
        due_line = _due_line(row)
        if due_line:
            self.stdout.write(due_line)
        paused = controls.pause_summary(row)
        if paused:
            self.stdout.write(_pause_line(paused))
        found = [item["cause"] for item in data["tracked"]]
        if any(found):
            self.stdout.write(f"  Not done: {causes.summary(found)}")
        stuck = escalation.state(row)
        if stuck is not None and stuck.current:
            self.stdout.write(_escalation_line(stuck))
        parked = breaker.parked_among([item["id"] for item in data["tracked"]])
        now = timezone.now()
        for item in data["tracked"]:
            ready = (item["cause"] or {}).get("kind") == "ready"
            symbol = (
                "⚠" if item["id"] in parked else status_symbol("ready" if ready else item["status"])
            )
            worker = ""
            if item["assignee"]:
                age = item.get("worker_seen")
                worker = f"  {item['assignee']}" + (
                    f" ({format_duration(now - age)} ago)" if age else ""
                )
            title = item["title"] or "(not in database)"
            if item["id"] in parked:
                worker = f"  parked: dispatch failed {parked[item['id']]} times in a row"
            if item["missing_from_source"]:
                worker += "  ⚠ missing from source"
            change = item["merge"]
            if change and item["status"] == "submitted":
                worker += "  " + " ".join(
                    p for p in (change["branch"], change["link"] or change["ref"]) if p
                )
            why = _cause_words(item["cause"])
            self.stdout.write(f"    {symbol} {item['id']:<16} {title}{worker}{why}")

    def do_pause(self, convoy: str, reason: str, actor: str, json: bool, **_: Any) -> None:
        row, changed = controls.pause(convoy, actor=actor, reason=reason)
        if json:
            self.write_json({"id": row.id, "changed": changed, "paused": controls.pause_json(row)})
        elif changed:
            self.stdout.write(f"⏸ Paused convoy 🚚 {row.id}: nothing is dispatched until resumed")
        else:
            self.stdout.write(f"○ Convoy {row.id} is already paused")
            paused = controls.pause_summary(row)
            if paused:
                self.stdout.write(_pause_line(paused))

    def do_resume(self, convoy: str, actor: str, json: bool, **_: Any) -> None:
        row, changed, fed = controls.resume(convoy, actor=actor)
        if json:
            self.write_json({"id": row.id, "changed": changed, "dispatched": fed})
        elif changed:
            names = ", ".join(f"{r['id']} → {r['worker']}" for r in fed) or "nothing ready"
            self.stdout.write(f"▶ Resumed convoy 🚚 {row.id}; dispatched {names}")
        else:
            self.stdout.write(f"○ Convoy {row.id} is not paused")

    def do_capacity(self, set: str | None, unset: bool, actor: str, json: bool, **_: Any) -> None:
        changed = None
        if set is not None or unset:
            old, new, fed = controls.set_cap(None if unset else set, actor=actor)
            dispatched = [r["id"] for r in fed]
            changed = {"old": old, "new": new, "dispatched": dispatched}
        report = capacity.report()
        if json:
            self.write_json({**report, **({"changed": changed} if changed else {})})
            return
        if changed:
            moved = ", ".join(dispatched) or "nothing"
            self.stdout.write(
                f"✓ Town cap {_cap_words(old)} → {_cap_words(new)}; dispatched {moved}"
            )
        source = report["source"]
        if report["set_by"]:
            source += f", set by {report['set_by']} at {report['set_at']:%Y-%m-%d %H:%M:%S} UTC"
        if not report["cap"]:
            self.stdout.write(
                f"Town capacity: {report['in_flight']} in flight, no cap ({source}): "
                "nothing waits for capacity"
            )
            return
        self.stdout.write(
            f"Town capacity: {report['in_flight']} in flight / cap {report['cap']} ({source}) · "
            f"{report['free']} free · {report['queued']} queued"
        )
        for item in report["queue"]:
            self.stdout.write(
                f"  {item['position']:>4}. {item['id']:<16} P{item['priority']}  "
                f"convoy {item['convoy']}  {' '.join(item['title'].split())[:60]}"
            )

    def do_ack(self, convoy: str, actor: str, json: bool, **_: Any) -> None:
        found, changed = escalation.acknowledge(convoy, actor=actor)
        row = found.row
        if json:
            self.write_json({"id": row.convoy_id, "changed": changed, **found.as_json()})
        elif changed:
            self.stdout.write(
                f"✓ Acknowledged convoy 🚚 {row.convoy_id}: no more reminders until it moves "
                "and stalls again"
            )
        else:
            self.stdout.write(
                f"○ Convoy {row.convoy_id} was already acknowledged by {row.acknowledged_by} "
                f"at {row.acknowledged_at:%Y-%m-%d %H:%M:%S} UTC"
            )

    def do_list(
        self,
        all: bool,
        status: str | None,
        tree: bool,
        json: bool,
        at_risk: bool = False,
        **_: Any,
    ) -> None:
        if at_risk:
            self.do_late(forecast.AT_RISK, json)
            return
        queryset = Convoy.objects.order_by("id")
        if status:
            queryset = queryset.filter(status=convoy_service.normalize_status(status))
        elif not all:
            queryset = queryset.filter(status__in=(CONVOY_OPEN, *STAGED_STATUSES))
        rows = list(queryset)
        if json:
            by_convoy = summaries.convoy_summaries(rows)
            self.write_json(
                [
                    {
                        "id": c.id,
                        "title": c.title,
                        "status": c.status,
                        "created_at": c.created_at,
                        "completed": by_convoy[c.id]["done"],
                        "due_at": c.due_at,
                        "deadline": forecasting.told_state(c, timezone.now()),
                        "total": by_convoy[c.id]["total"],
                        "progress": summaries.progress_json(by_convoy[c.id]),
                    }
                    for c in rows
                ]
            )
            return
        if not rows:
            self.stdout.write("No convoys.")
            return
        by_convoy = summaries.convoy_summaries(rows)
        details = convoy_service.tracked_details(rows) if tree else {}
        for row in rows:
            s = by_convoy[row.id]
            waiting = f" (◐ {s['submitted']} submitted)" if s["submitted"] else ""
            waiting += f" (⤼ {s['skipped']} skipped)" if s["skipped"] else ""
            self.stdout.write(
                f"🚚 {row.id}  {status_words(row.state):<24} {s['done']}/{s['total']}{waiting}  "
                f"{convoy_title(row.title)}"
            )
            for index, (bead_id, bead) in enumerate(details.get(row.id, [])):
                branch = "└──" if index == len(details[row.id]) - 1 else "├──"
                status_ = bead.status if bead else "unknown"
                self.stdout.write(
                    f"   {branch} {status_symbol(status_)} {bead_id} "
                    f"{bead.title if bead else ''}".rstrip()
                )

    def do_update(
        self,
        convoy: str,
        due: str | None,
        no_due: bool,
        merge: str | None,
        title: str | None,
        json: bool,
        **_: Any,
    ) -> None:
        if due is not None and not due.strip():
            raise error("--due is empty: --no-due removes a due time")
        fields: dict[str, Any] = {"due_at": "" if no_due else due, "merge_strategy": merge}
        fields["title"] = title
        changed = {k: v for k, v in fields.items() if v is not None}
        if not changed:
            raise error("give --due, --no-due, --merge or --title")
        row = convoy_service.update_fields(convoy, actor="cli", **changed)
        if json:
            self.write_json(summaries.convoy_status_json(row))
            return
        self.stdout.write(f"✓ Updated 🚚 {row.id}: {convoy_title(row.title)}")
        self.stdout.write(_due_line(row) or "  No due time")

    def do_late(self, state: str, json: bool) -> None:
        """`list --at-risk`, `stranded --overdue`: the open convoys in that deadline state."""
        rows = [
            (c, found)
            for c, said, found in forecasting.open_deadlines(timezone.now())
            if said == state
        ]
        if json:
            self.write_json([summaries.deadline_json(c, state, found) for c, found in rows])
            return
        if not rows:
            self.stdout.write(f"No convoys {forecast.WORDS[state]}.")
        for row, _ in rows:
            self.stdout.write(f"🚚 {row.id}: {convoy_title(row.title)}\n{_due_line(row)}")

    def do_stranded(self, json: bool, overdue: bool = False, **_: Any) -> None:
        if overdue:
            self.do_late(forecast.OVERDUE, json)
            return
        rows = feeding.stranded()
        if json:
            # The original's shape: kind, cause and reason are ours.
            ours = ("kind", "cause", "reason")
            self.write_json([{k: v for k, v in r.items() if k not in ours} for r in rows])
            return
        if not rows:
            self.stdout.write("No stranded convoys.")
        for row in rows:
            if row["kind"] == "empty":
                note = "Empty convoy (0 tracked issues) — needs cleanup"
            elif row["kind"] == "feedable":
                note = f"{row['ready_count']} ready: {', '.join(row['ready_issues'])}"
            elif row["cause"] == stranding.WAITING_FOR_CAPACITY:
                note = f"{row['reason']} ({row['tracked_count']} tracked)"
            else:  # the original's "stuck": tracked work, none ready
                lead = "stuck behind work in progress" if row["kind"] == "moving" else "stuck"
                note = f"{lead}: {row['reason']} ({row['tracked_count']} tracked, 0 ready)"
            self.stdout.write(f"🚚 {row['id']}: {row['title']}\n    {note}")

    # --- stage / launch / feed --------------------------------------------------------------
    def do_stage(
        self, ids: list[str], title: str | None, force: bool, json: bool, **options: Any
    ) -> None:
        and_launch = options.get("launch", False)
        plan = staging.stage(ids, title, merge=options.get("merge", ""), due=options.get("due"))
        if json:
            if plan.errors or not and_launch:
                self.write_json(plan.as_json())
            if plan.errors:
                raise error(plan.refusal)
            if and_launch:
                result = launch.launch_staged(plan.convoy_id, force=force)
                self.write_json({"stage": plan.as_json(), "launch": result.as_json()})
            return
        text, errors = plan.render()
        if errors:
            self.stdout.write(text)
            self.stderr.write(errors)
            raise error(plan.refusal)
        if plan.restaged:
            self.stdout.write(f"Re-staging existing convoy {plan.convoy_id}")
        self.stdout.write(text)
        verb = "updated" if plan.restaged else "created"
        self.stdout.write(f"Convoy {verb}: {plan.convoy_id} ({status_words(plan.status)})")
        if plan.moved:
            for bead_id, (before, after) in sorted(plan.moved.items()):
                self.stdout.write(f"  moved {bead_id}: wave {before or '-'} → {after or '-'}")
        if and_launch:
            result = launch.launch_staged(plan.convoy_id, force=force)
            self._launch_output(result, False)

    def do_launch(
        self, ids: list[str], title: str | None, force: bool, json: bool, **_: Any
    ) -> None:
        result = launch.launch(ids, force=force, title=title)
        self._launch_output(result, json)

    def _launch_output(self, result: launch.LaunchResult, json: bool) -> None:
        if json:
            self.write_json(result.as_json())
            return
        for warning in result.warnings:
            self.stdout.write(warning)
        self.stdout.write(render_launch(result.as_report()))

    def do_reproject(self, ids: list[str], **_: Any) -> None:
        for convoy_id in ids:
            convoy_service.get_convoy(convoy_id)  # an unknown id: a one-line error, nothing done
        started = time.monotonic()
        projection.rebuild(ids or None)
        what = f"{len(ids)} convoy(s)" if ids else "every bead and convoy"
        self.stdout.write(f"✓ Reprojected {what} in {time.monotonic() - started:.2f} s")

    def do_feed(self, json: bool, **_: Any) -> None:
        timekeeping.pass_time()
        catch = feeding.catch_up()
        scan = feeding.stranded_scan()
        escalated = escalation.escalate_stuck()
        told = deadlines.check()
        if json:
            self.write_json(
                {
                    "catch_up": catch,
                    "stranded": scan,
                    "escalated": escalated,
                    "deadlines": [{"id": t.convoy_id, "state": t.state} for t in told],
                }
            )
            return
        for change in told:
            self.stdout.write(f"⏰ Convoy {change.convoy_id}: {forecast.WORDS[change.state]}")
        for item in escalated:
            self.stdout.write(
                f"⏰ Escalated stuck convoy {item['id']} ({item['escalation']} of "
                f"{escalation.MAX_NOTIFICATIONS}): {'; '.join(item['causes'])}"
            )
        if "seeded" in catch:
            self.stdout.write(f"Catch-up: seeded the high-water mark at #{catch['seeded']}")
        elif "handled" in catch:
            self.stdout.write(
                f"Catch-up: handled {len(catch['handled'])} close event(s), "
                f"mark at #{catch['position']}"
            )
        if "skipped" in scan:
            self.stdout.write(f"Stranded scan: {scan['skipped']}")
        else:
            self.stdout.write(
                f"Stranded scan: dispatched {', '.join(scan['dispatched']) or 'nothing'}; closed "
                f"empty {', '.join(scan['closed_empty']) or 'none'}; landed "
                f"{', '.join(scan['landed']) or 'none'}"
            )


def _escalation_line(found: escalation.State) -> str:
    row = found.row
    line = (
        f"  ⏰ Stuck since {row.progress_at:%Y-%m-%d %H:%M:%S} UTC: escalated {row.count} of "
        f"{escalation.MAX_NOTIFICATIONS} times"
    )
    if row.acknowledged_at:
        return line + f", acknowledged by {row.acknowledged_by}"
    return line + f" (`convoy ack {row.convoy_id}` stops it)"


def _cap_words(value: int | None) -> str:
    return str(value) if value else "none (unlimited)"


def _cause_words(cause: Mapping[str, Any] | None) -> str:
    """ "  — blocked: blocked by gt-a", with the time a cooldown ends or a rescue comes."""
    if not cause:
        return ""
    when = cause.get("until") or cause.get("rescue_by")
    at = f" ({'until' if cause.get('until') else 'by'} {when[11:19]} UTC)" if when else ""
    return f"  — {cause['kind']}: {cause['text']}{at}"


def _due_line(convoy: Convoy) -> str:
    """ "  Due: … · at risk: …" for a convoy with a due time; "" without one."""
    if convoy.due_at is None:
        return ""
    now = timezone.now()
    state, found = forecasting.deadline_of(convoy, now)
    words = forecast.described(convoy.due_at, state, found, now)
    return f"  Due: {convoy.due_at:%Y-%m-%d %H:%M} UTC · {words}"


def _pause_line(paused: Mapping[str, Any]) -> str:
    since = paused["dispatches_since"]
    return (
        f"  ⏸ Paused by {paused['by'] or '?'} at {paused['at']:%Y-%m-%d %H:%M:%S} UTC"
        + (f" — {paused['reason']}" if paused["reason"] else "")
        + f" ({since} dispatch{'es' if since != 1 else ''} since pause)"
    )


def _remaining(info: Mapping[str, Any]) -> str:
    open_ = info["total"] - info["done"] - info["unknown"]
    if info["total"] == 0:
        return "0 tracked issues (an empty convoy is never complete)"
    if info["unknown"] and open_:
        return f"{open_} open, {info['unknown']} unknown issue(s) remaining"
    if info["unknown"]:
        return f"{info['unknown']} tracked issue(s) with unknown status"
    return f"{open_} open issue(s) remaining"
