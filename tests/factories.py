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


def child(parent, kid):
    return beads.add_dependency(kid, parent, "parent-child", actor="test")
