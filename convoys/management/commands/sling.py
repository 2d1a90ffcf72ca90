"""`manage.py sling <bead>… [rig] [--no-convoy] [--owned] [--merge M] [--force]`."""

from ...models import Rig
from ...services import sling
from ...services.beads import check_bead_id
from ..base import ServiceCommand


class Command(ServiceCommand):
    help = "Dispatch beads now: one gets a `Work:` convoy, several a `Batch:` convoy."

    def add_arguments(self, parser):
        parser.add_argument("args", nargs="+", metavar="bead… [rig]")
        parser.add_argument("--no-convoy", action="store_true")
        parser.add_argument("--owned", action="store_true")
        parser.add_argument("--merge", default="")
        parser.add_argument("--force", action="store_true")
        self.add_json(parser)

    def handle(self, *args, no_convoy, owned, merge, force, json, **_):
        ids, rig = list(args), None
        if len(ids) >= 2 and Rig.objects.filter(pk=ids[-1]).exists():
            rig = ids.pop()
            if len(ids) > 1:
                self.stderr.write(
                    "tip: the rig can be auto-resolved from bead prefixes. You can omit <rig>."
                )
        for bead_id in ids:
            check_bead_id(bead_id)
        convoy, rig, results = sling.sling(
            ids, rig, no_convoy=no_convoy, owned=owned, merge=merge, force=force
        )
        if json:
            self.write_json(
                {"convoy_id": convoy.pk if convoy else "", "rig": rig, "dispatched": results}
            )
            return
        if convoy:
            self.stdout.write(f"→ Convoy 🚚 {convoy.pk}: {convoy.title}")
        for row in results:
            mark = "✓" if row["ok"] else "✗"
            detail = row["worker"] if row["ok"] else row["error"]
            self.stdout.write(f"  {mark} {row['id']} → {detail}")
        ok = sum(1 for r in results if r["ok"])
        if len(results) > 1:
            self.stdout.write(f"📊 Batch sling complete: {ok}/{len(results)} succeeded")
