"""Small builders for tests; every write goes through the services."""

from convoys.services import beads


def bead(bead_id, title=None, *, type="task", status="open", priority=2, assignee=""):
    created = beads.create_bead(
        title or f"Bead {bead_id}",
        bead_id=bead_id,
        issue_type=type,
        priority=priority,
        assignee=assignee,
        actor="test",
    )
    if status != "open":
        created = beads.update_bead(bead_id, status=status, actor="test")
    return created


def blocks(blocker, blocked, dep_type="blocks"):
    """`blocker` blocks `blocked` (blocked depends on blocker)."""
    return beads.add_dependency(blocked, blocker, dep_type, actor="test")


def imported_blocks(blocker, blocked):
    """A blocking dependency as an import of a bd export may bring it: unchecked (a cycle,
    which the services refuse and staging must catch)."""
    from django.utils import timezone

    from convoys.models import Dependency

    return Dependency.objects.create(
        issue_id=blocked, depends_on_id=blocker, type="blocks", created_at=timezone.now()
    )


def child(parent, kid):
    return beads.add_dependency(kid, parent, "parent-child", actor="test")


def epic_of(epic_id, kids, title="Epic"):
    """An epic with task children."""
    bead(epic_id, title, type="epic")
    for kid in kids:
        bead(kid)
        child(epic_id, kid)


def staged_on_parked_rig():
    """gt-epic (gt-x blocks gt-y) staged while gastown is parked: a staged_warnings plan."""
    from convoys.services import rigs, staging

    epic_of("gt-epic", ["gt-x", "gt-y"])
    blocks("gt-x", "gt-y")
    rigs.set_rig_state("gastown", "parked", actor="test")
    return staging.stage(["gt-epic"], actor="test")


def command(*args):
    """A management command's stdout (call_command)."""
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def signed_in(username, *codenames):
    """A test client logged in as a new user with these convoys permissions."""
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    user = User.objects.create_user(username, password="pw-pw-pw-123")
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client
