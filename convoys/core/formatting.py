"""Text and JSON shapes shared by the CLI and the web pages (the original's stage and launch
reports, adapted)."""

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from convoys.core.dag import DAG, EPIC, Finding, Gated, Node, max_parallelism

RULE = "─" * 80


def page_fix(fix: str, category: str) -> str:
    """A staging finding's fix in a page's words: pages have a button where the command line
    has a command (a parked rig is un-parked under "Waiting on rigs")."""
    if category == "blocked-rig":
        return "restore the rig with its button under “Waiting on rigs” on the convoy page"
    return fix


def percent_done(done: int, total: int) -> int:
    """The one rounding rule for "% done": to the nearest whole percent (4 of 6 is 67), but
    never 100 before every bead is done nor 0 once one is."""
    if total <= 0 or done <= 0:
        return 0
    if done >= total:
        return 100
    return min(max(round(100 * done / total), 1), 99)


def several(n: int, noun: str, plural: str = "") -> str:
    """ "1 bead", "3 beads", "0 beads" (`plural` when it is not noun + "s")."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def truncate(text: str, width: int = 28) -> str:
    return text if len(text) <= width else text[:width] + ".."


def node_line(node: Node) -> str:
    line = f"{node.id} [{node.type or 'task'}] {node.title}"
    if node.rig:
        line += f" (rig: {node.rig})"
    line += f" [{node.status}]"
    if node.blocked_by:
        line += f" ← blocked by: {', '.join(sorted(node.blocked_by))}"
    return line


def render_tree(dag: DAG, input_kind: str, root: str | None = None) -> str:
    """The epic's parent-child tree as text (each bead once, where it is first reached), or
    the beads one per line. Indentation stops growing at MAX_INDENT levels, so the text stays
    linear in the number of beads however deep the tree."""
    if input_kind == EPIC and root in dag.nodes:
        lines = [node_line(dag.nodes[root])]
        for node_id, depth, prefix, last in _walk(dag, root):
            if depth > MAX_INDENT:
                prefix = f"{prefix}… {depth - MAX_INDENT} levels deeper "
            lines.append(prefix + ("└── " if last else "├── ") + node_line(dag.nodes[node_id]))
        return "\n".join(lines) + "\n"
    return "".join(f"  {node_line(dag.nodes[n])}\n" for n in sorted(dag.nodes))


MAX_INDENT = 32  # tree levels drawn with their own indentation


def _walk(dag: DAG, root: str) -> Iterator[tuple[str, int, str, bool]]:
    """(id, depth, prefix, last child) of each bead below `root`, depth first, each once; the
    prefix is shared by siblings and bounded by MAX_INDENT levels."""
    seen = {root}
    kids = sorted(set(dag.nodes[root].children))
    stack = [(child, 1, "", i == len(kids) - 1) for i, child in enumerate(kids)][::-1]
    while stack:
        node_id, depth, prefix, last = stack.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        yield node_id, depth, prefix, last
        kids = sorted(set(dag.nodes[node_id].children))
        inner = prefix if depth >= MAX_INDENT else prefix + ("    " if last else "│   ")
        for i, child in reversed(list(enumerate(kids))):
            stack.append((child, depth + 1, inner, i == len(kids) - 1))


def render_wave_table(dag: DAG, waves: Sequence[Sequence[str]]) -> str:
    lines = [
        "  %-6s %-15s %-30s %-12s %s" % ("Wave", "ID", "Title", "Rig", "Blocked By"),
        "  " + RULE,
    ]
    total = 0
    for number, wave in enumerate(waves, start=1):
        for node_id in wave:
            node = dag.nodes[node_id]
            blocked = ", ".join(node.blocked_by) if node.blocked_by else "—"
            lines.append(
                "  %-6d %-15s %-30s %-12s %s"
                % (number, node.id, truncate(node.title), node.rig or "?", blocked)
            )
            total += 1
    size, at = max_parallelism(waves)
    lines.append("")
    lines.append(
        f"  {several(total, 'task')} across {several(len(waves), 'wave')}"
        f" (max parallelism: {size} in wave {at})"
    )
    return "\n".join(lines) + "\n"


def render_gated(dag: DAG, gated: Sequence[Gated]) -> str:
    if not gated:
        return ""
    lines = ["", "  Gated (blocked by open non-slingable nodes):", "  " + RULE]
    for item in gated:
        by = ", ".join(item.gated_by) if item.gated_by else "(transitively gated)"
        lines.append(
            "  %-15s %-30s ← gated by %s" % (item.id, truncate(dag.nodes[item.id].title), by)
        )
    lines.append("")
    lines.append(
        f"  {len(gated)} task(s) gated, will not be dispatched until blockers are resolved"
    )
    return "\n".join(lines) + "\n"


def render_findings(title: str, findings: Sequence[Finding]) -> str:
    if not findings:
        return ""
    out = [f"{title}:"]
    for index, finding in enumerate(findings, start=1):
        out.append(f"  {index}. [{finding.category}] {finding.message}")
        if finding.bead_ids:
            out.append(f"     Affected: {', '.join(finding.bead_ids)}")
        if finding.suggested_fix:
            out.append(f"     Fix: {finding.suggested_fix}")
    return "\n".join(out) + "\n"


def tree_json(dag: DAG, input_kind: str, root: str | None = None) -> list[dict[str, Any]]:
    """The epic's tree as nested entries (each bead once, where it is first reached), or the
    beads as a flat list: built without recursion, linear in the number of beads. Nesting
    stops at MAX_INDENT levels: deeper beads are listed, each with its "depth", among the
    children of their ancestor at that level."""

    def entry(node_id: str) -> dict[str, Any]:
        node = dag.nodes[node_id]
        data: dict[str, Any] = {
            "id": node.id,
            "title": node.title,
            "type": node.type,
            "status": node.status,
        }
        if node.rig:
            data["rig"] = node.rig
        return data

    if input_kind != EPIC or root not in dag.nodes:
        return [entry(n) for n in sorted(dag.nodes)]
    top = entry(root)
    seen = {root}
    # (bead, its entry, its depth, the list its descendants go to once nesting stops)
    todo: list[tuple[str, dict[str, Any], int, list[dict[str, Any]] | None]] = [
        (root, top, 0, None)
    ]
    while todo:
        node_id, data, depth, flat = todo.pop()
        kids = [c for c in sorted(set(dag.nodes[node_id].children)) if c not in seen]
        if not kids:
            continue
        seen.update(kids)
        entries = [entry(child) for child in kids]
        if flat is None and depth < MAX_INDENT:
            data["children"] = entries
        else:  # below MAX_INDENT levels: listed flat under that ancestor, with their depth
            for item in entries:
                item["depth"] = depth + 1
            if flat is None:
                flat = data["children"] = entries
            else:
                flat.extend(entries)
        # Depth first, in order, as the tree is read: the first child's subtree first.
        todo.extend(
            (child, item, depth + 1, flat)
            for child, item in reversed(list(zip(kids, entries, strict=True)))
        )
    return [top]


def waves_json(dag: DAG, waves: Iterable[Iterable[str]]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = []
    for number, wave in enumerate(waves, start=1):
        tasks: list[dict[str, Any]] = []
        for node_id in wave:
            node = dag.nodes[node_id]
            task: dict[str, Any] = {
                "id": node.id,
                "title": node.title,
                "type": node.type,
                "rig": node.rig,
            }
            if node.blocked_by:
                task["blocked_by"] = sorted(node.blocked_by)
            tasks.append(task)
        result.append({"number": number, "tasks": tasks})
    return result


def render_launch(result: Mapping[str, Any]) -> str:
    """The launch report (as `gt convoy launch` prints it), adapted to this product's commands."""
    cid = result["convoy_id"]
    waves = result.get("waves", [])
    lines = [
        f"Convoy launched: {cid} (status: {result['status']})",
        "",
        f"  Monitor: python manage.py convoy status {cid}",
        "",
        "Wave summary:",
        f"  {len(waves)} waves, {sum(len(w) for w in waves)} tasks total",
    ]
    for number, wave in enumerate(waves, start=1):
        state = "dispatched" if number == 1 else "pending"
        lines.append(f"  Wave {number}: {len(wave)} tasks ({state})")
    lines += ["", "Dispatched (Wave 1):"]
    for row in sorted(result["dispatched"], key=lambda r: r["id"]):
        mark = "✓" if row["ok"] else "✗"
        line = f"  {mark} {row['id']}  {row.get('title', '')}  (rig: {row['rig']})"
        if not row["ok"]:
            line += f"    error: {row['error']}"
        lines.append(line)
    if result["skipped"]:
        lines += ["", "Skipped (Wave 1):"]
        for row in result["skipped"]:
            lines.append(f"  ○ {row['id']}  {row['reason']}")
    lines += [
        "",
        f"  Hint: open /convoys/{cid}/ in the web dashboard to watch it live",
        "",
        "Subsequent waves will be dispatched automatically by the feeder as tasks complete.",
    ]
    return "\n".join(lines) + "\n"


# --- words and times for people (web pages) -----------------------------------------------------
STATUS_WORDS = {
    "staged_ready": "staged, ready to launch",
    "staged_warnings": "staged with warnings",
    "in_progress": "in progress",
    "hooked": "hooked (dispatched)",
    "tombstone": "deleted",
    "submitted": "submitted, waiting to merge",
    "skipped": "skipped (not needed)",
    "unknown": "not in database",
}
EVENT_WORDS = {
    "bead.created": "bead created",
    "bead.updated": "bead updated",
    "bead.status": "status changed",
    "bead.closed": "bead closed",
    "bead.reopened": "bead reopened",
    "bead.skipped": "bead skipped (not needed)",
    "bead.released": "bead released back to ready",
    "bead.reassigned": "bead reassigned",
    "bead.merged": "change merged",
    "merge.opened": "change submitted",
    "merge.abandoned": "change abandoned",
    "bead.dispatched": "dispatched",
    "dispatch.failed": "dispatch failed",
    "dispatch.ok": "worker has it",
    "dispatch.confirmed": "dispatch confirmed by its worker",
    "dispatch.abandoned": "claim released: never sent",
    "dispatch.released": "dispatch released: outcome unknown",
    "convoy.created": "convoy created",
    "convoy.staged": "convoy staged",
    "convoy.restaged": "convoy re-staged",
    "convoy.launched": "convoy launched",
    "convoy.tracked": "beads added",
    "convoy.landed": "convoy landed",
    "convoy.closed": "convoy closed",
    "convoy.reopened": "convoy reopened",
    "convoy.imported": "convoy imported",
    "rig.state": "rig state changed",
    "stranded.found": "found stranded",
    "notification": "subscribers told",
    "spin": "spin warning",
}
ACTOR_CHANNELS = ("web:", "api:", "cli:", "admin:")
CONVOY_TITLE_PREFIX = "Convoy: "


def status_words(status: str | None) -> str:
    """`staged_warnings` -> "staged with warnings"; plain words pass through."""
    status = status or "unknown"
    return STATUS_WORDS.get(status, status.replace("_", " "))


def event_words(kind: str) -> str:
    return EVENT_WORDS.get(kind, kind.replace(".", " ").replace("_", " "))


def person(actor: str) -> str:
    """One name per person: `api:demo`, `web:demo` and `demo` are all "demo"."""
    for channel in ACTOR_CHANNELS:
        if actor.startswith(channel):
            return actor[len(channel) :]
    return actor


# What does the work when no person does (dispatch paths and system actors), in words.
SYSTEM_ACTORS = {
    "event": "the feeder",
    "feeder": "the feeder",
    "launch": "the launch",
    "manual": "a sling",
    "stranded": "the stranded scan",
    "batch": "the catch-up",
    "poll": "the catch-up",
    "escalation": "the stuck check",
    "import": "an import",
    "sync": "a sync",
    "cli": "the command line",
}


def actor_words(actor: str) -> str:
    """Who did it, for a timeline: a person's name, or what the system part is called."""
    return SYSTEM_ACTORS.get(actor, person(actor))


def change_words(changes: Mapping[str, Any], width: int = 60) -> str:
    """A bead.updated event's changes: 'title changed from "a" to "b"; priority from 2 to 1'."""
    parts = []
    for field, pair in changes.items():
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            continue
        old, new = (truncate(str(v), width) if isinstance(v, str) else v for v in pair)
        shown = [f'"{v}"' if isinstance(v, str) else str(v) for v in (old, new)]
        parts.append(f"{field} changed from {shown[0]} to {shown[1]}")
    return "; ".join(parts)


def convoy_title(title: str) -> str:
    """A convoy's title without the "Convoy: " that staging puts in front of an epic's title
    (pages already say "convoy"; "Convoy landed: Convoy: …" reads twice)."""
    if title.startswith(CONVOY_TITLE_PREFIX):
        return title[len(CONVOY_TITLE_PREFIX) :]
    return title


# How a relative time is worded, here and (through the pages' `browser-rules` block) by the
# script that rewords the times of a page left open.
RELATIVE_WORDS = {
    "soon": "in under a minute",
    "now": "just now",
    "ahead": "in {}",
    "ago": "{} ago",
    "instant": "<1m",
}


def relative(moment: datetime, now: datetime) -> str:
    """ "3m ago", "in 2h 5m", "just now", "in under a minute"."""
    seconds = (moment - now).total_seconds()
    if 0 < seconds < 60:
        return RELATIVE_WORDS["soon"]
    if abs(seconds) < 60:
        return RELATIVE_WORDS["now"]
    text = duration(abs(seconds))
    return RELATIVE_WORDS["ahead" if seconds > 0 else "ago"].format(text)


def duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return RELATIVE_WORDS["instant"]
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


EXACT_FORMAT = "%Y-%m-%d %H:%M:%S %Z"


def terminal_safe(text: str) -> str:
    """Text from elsewhere (a worker's log line) as a terminal may print it: control
    characters other than a tab shown as escapes (`\\x1b`), so none of them moves the
    cursor, recolours or retitles the terminal."""
    return "".join(
        c if c == "\t" or not (ord(c) < 32 or 0x7F <= ord(c) < 0xA0) else f"\\x{ord(c):02x}"
        for c in text
    )
