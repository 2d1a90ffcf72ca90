"""`manage.py sling <bead>… [rig] | <convoy>  [--no-convoy] [--owned] [--merge M] [--force]`."""

from argparse import ArgumentParser
from collections.abc import Iterable, Mapping
from typing import Any

from convoys.management.base import ServiceCommand, error
from convoys.models import Rig
from convoys.services import sling
from convoys.services.beads import check_bead_id


class Command(ServiceCommand):
    help = (
        "Dispatch beads now: one gets a `Work:` convoy, several a `Batch:` convoy. A convoy id "
        "dispatches each of its ready beads (the convoy is the container: no new convoy) and "
        "lists the others with the reason. Epics are staged, not slung; a bead with open "
        "blockers is refused unless --force."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("args", nargs="+", metavar="bead… [rig] | convoy")
        parser.add_argument("--no-convoy", action="store_true", help="no auto-convoy")
        parser.add_argument("--owned", action="store_true", help="the auto-convoy is owned")
        parser.add_argument("--merge", default="", help="the auto-convoy's merge strategy")
        parser.add_argument(
            "--force",
            action="store_true",
            help="dispatch past open blockers (recorded on the dispatch), to another rig's "
            "target or a parked rig",
        )
        self.add_json(parser)

    def handle(
        self,
        *args: str,
        no_convoy: bool,
        owned: bool,
        merge: str,
        force: bool,
        json: bool,
        **_: Any,
    ) -> None:
        ids, rig = list(args), None
        if len(ids) >= 2 and Rig.objects.filter(pk=ids[-1]).exists():
            rig = ids.pop()
            if len(ids) > 1:
                self.stderr.write(
                    "tip: the rig can be auto-resolved from bead prefixes. You can omit <rig>."
                )
        for bead_id in ids:
            check_bead_id(bead_id)
        if len(ids) == 1 and sling.is_convoy(ids[0]):
            if rig or owned or merge:
                raise error(
                    "a convoy's beads go to their own rigs and it is their convoy: "
                    "give no rig, --owned or --merge"
                )
            self.sling_convoy(ids[0], force, json)
            return
        convoy, rig, results = sling.sling(
            ids, rig, no_convoy=no_convoy, owned=owned, merge=merge, force=force
        )
        ok = sum(1 for r in results if r["ok"])
        if json:
            self.write_json(
                {"convoy_id": convoy.pk if convoy else "", "rig": rig, "dispatched": results}
            )
        else:
            if convoy:
                self.stdout.write(f"→ Convoy 🚚 {convoy.pk}: {convoy.title}")
            self.write_results(results)
            if len(results) > 1:
                self.stdout.write(f"📊 Batch sling complete: {ok}/{len(results)} succeeded")
        if results and not ok:  # a script must tell that nothing went out
            raise error(f"nothing dispatched: {len(results)} of {len(results)} refused")

    def sling_convoy(self, convoy_id: str, force: bool, json: bool) -> None:
        convoy, results, skipped = sling.sling_convoy(convoy_id, force=force)
        if json:
            self.write_json({"convoy_id": convoy.pk, "dispatched": results, "skipped": skipped})
            return
        self.stdout.write(f"→ Convoy 🚚 {convoy.pk}: {convoy.title} (its own container)")
        self.write_results(results)
        for row in skipped:
            self.stdout.write(f"  ○ {row['id']} skipped: {row['reason']}")
        ok = sum(1 for r in results if r["ok"])
        self.stdout.write(
            f"📊 Convoy sling complete: {ok}/{len(results)} dispatched, {len(skipped)} skipped"
        )

    def write_results(self, results: Iterable[Mapping[str, Any]]) -> None:
        for row in results:
            mark = "✓" if row["ok"] else "✗"
            detail = row["worker"] if row["ok"] else row["error"]
            forced = "  (forced past open blockers)" if row["forced"] else ""
            self.stdout.write(f"  {mark} {row['id']} → {detail}{forced}")
