from collections.abc import Iterable, Mapping
from datetime import datetime
from html import escape
from typing import Any

from django import template
from django.template import Context
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from convoys.core import forecast, formatting
from convoys.core.ids import quoted_url_segment
from convoys.models import Convoy, Event
from convoys.read.dashboard import DashboardRow
from convoys.read.summaries import status_class
from convoys.rules import causes, forecasting
from convoys.templatetags.bar_tags import bar

register = template.Library()


@register.filter
def symbol(state: str) -> str:
    """The icon of a bead state, the same as on its DAG node."""
    return status_class(state)[1]


@register.filter
def convoy_state(convoy: Convoy) -> str:
    """A convoy's status in words: "landed" when its work completed, not "closed"."""
    return formatting.status_words(convoy.state)


@register.filter
def get(mapping: Mapping[Any, Any] | None, key: Any) -> Any:
    return mapping.get(key) if mapping else None


@register.simple_tag(takes_context=True)
def when(context: Context, moment: datetime | None, style: str = "relative") -> str:
    """A time for people: relative words ("3m ago") or the exact time, and the exact time with
    its time zone on hover; one format on every page."""
    if not moment:
        return "—"
    exact = timezone.localtime(moment).strftime(formatting.EXACT_FORMAT)
    if style == "exact":
        return format_html(
            '<time datetime="{}" title="{}">{}</time>', moment.isoformat(), exact, exact
        )
    # data-relative: live.js words it again every so often, so a page left open keeps true.
    now = context.get("now") or timezone.now()
    words = escape(formatting.relative(moment, now))
    # Formatted times and escaped words: no format_html (a dashboard draws four hundred).
    return mark_safe(  # noqa: S308
        f'<time datetime="{moment.isoformat()}" title="{escape(exact)}" data-relative>{words}</time>'
    )


register.filter("words", formatting.status_words)
register.filter("event_words", formatting.event_words)
register.filter("person", formatting.person)
register.filter("page_fix", formatting.page_fix)
register.filter("cause_word", causes.word)
register.filter("deadline_word", lambda state: forecast.WORDS.get(state, state))
register.filter("actor_words", formatting.actor_words)
register.filter("convoy_title", formatting.convoy_title)


@register.simple_tag
def wave_options(numbers: Iterable[int], chosen: int | None, frontier: int | None) -> SafeString:
    """The timeline's wave choices (up to 60 options on every live update)."""
    return mark_safe(  # noqa: S308 (numbers only)
        "".join(
            f'<option value="{int(n)}"{" selected" if n == chosen else ""}>{int(n)}'
            f"{' (frontier)' if n == frontier else ''}</option>"
            for n in numbers
        )
    )


@register.simple_tag
def gantt_rows(rows: list[dict[str, Any]]) -> SafeString:
    """The timeline's rows (`timeline.Gantt.rows`): a bar per span, drawn here rather than by a
    template loop (150 rows of a few bars each, on every live update of the convoy page)."""
    return mark_safe("".join(_gantt_row(r) for r in rows))  # noqa: S308 (each value escaped)


def _gantt_row(row: dict[str, Any]) -> str:
    bead, state, href = escape(row["id"]), escape(row["state"]), escape(row["href"])
    bars = row["bars"]
    label = escape("; ".join(b["title"] for b in bars)) if bars else "waiting"
    rects = "".join(
        f'<rect class="g-{escape(b["phase"])}" x="{b["x"]:g}" width="{b["width"]:g}" y="1" '
        f'height="8"><title>{escape(b["title"])}</title></rect>'
        for b in bars
    )
    return (
        f'\n      <tr data-bead="{bead}"><th scope="row"><a class="gantt-id ph-{state}" '
        f'href="{href}">{bead}</a></th>\n        <td><svg class="gantt-bar" viewBox="0 0 100 10" '
        f'preserveAspectRatio="none" role="img" aria-label="{bead}: {label}">{rects}</svg></td></tr>'
    )


@register.simple_tag(takes_context=True)
def timeline_items(context: Context, events: Iterable[Event]) -> SafeString:
    """A timeline's items, newest first, drawn here rather than by a template loop (a hundred
    events on every live update of a convoy page)."""
    items = [_timeline_item(context, e) for e in events]
    return mark_safe("".join(items) or "<li>Nothing has happened yet.</li>")  # noqa: S308


def _timeline_item(context: Context, event: Event) -> str:
    data = event.data if isinstance(event.data, dict) else {}
    out = [f'<li data-seq="{event.seq}">{when(context, event.created_at)} ']
    out.append(f'<span class="kind">{escape(formatting.event_words(event.kind))}</span>')
    if event.bead_id:
        out.append(f" <code>{escape(event.bead_id)}</code>")
    if event.kind == "bead.status":
        out.append(f" — {escape(formatting.status_words(_text(data.get('status'))))}")
        if data.get("assignee"):
            out.append(f", assigned to {escape(_text(data['assignee']))}")
    if event.kind == "bead.updated" and isinstance(data.get("changes"), dict):
        said = formatting.change_words(data["changes"])
        if said:
            out.append(f" — {escape(said)}")
    if data.get("assignee") and event.kind != "bead.status":
        out.append(f" → {escape(_text(data['assignee']))}")
    if data.get("error"):
        out.append(f" ✗ {escape(_text(data['error']))}")
    if data.get("state"):
        out.append(f" {escape(_text(data.get('rig')))}: {escape(_text(data['state']))}")
    out.append(" ")
    if event.actor:
        out.append(f'<span class="actor">by {escape(formatting.actor_words(event.actor))}</span>')
    if data.get("action") and data.get("words"):  # a bead action: what it did, and why
        out.append(f' <span class="did">— {escape(_text(data["words"]))}</span>')
        if data.get("reason"):
            out.append(f' <q class="why">{escape(_text(data["reason"]))}</q>')
    out.append("</li>")
    return "".join(out)


def _text(value: Any) -> str:
    """A value of an event's data as a template prints it ("" for none)."""
    return "" if value is None else str(value)


@register.simple_tag(takes_context=True)
def convoy_row(context: Context, row: DashboardRow) -> SafeString:
    """A dashboard row, drawn here rather than by a template (two hundred on a page, and the
    template's lookups were most of the page's time). Every text is escaped."""
    c, s = row.convoy, row.s
    cid = escape(c.pk)
    state = s["state"]
    tags = ""
    if s["stranded"]:
        kind = "paused" if state.code == "paused" else "warn"
        tags += (
            f'\n      <span class="tag {kind} stranded-badge" title="{escape(state.reason)}">'
            f"{escape(state.label)}</span>"
        )
    if c.paused_at and state.code != "paused":
        by = formatting.person(c.paused_by) or "someone"
        why = f": {c.pause_reason}" if c.pause_reason else ""
        tags += (
            f'\n      <span class="tag paused" title="paused by {escape(by + why)}">paused</span>'
        )
    if s["spin"]:
        tags += (
            '\n      <span class="tag bad" title="a bead was dispatched more than 3 times in an '
            'hour">spin</span>'
        )
    deadline = forecasting.told_state(c, context.get("now") or timezone.now())
    if deadline:
        due = c.due_at.strftime("%Y-%m-%d %H:%M UTC") if c.due_at else ""
        tags += (
            f'\n      <span class="tag deadline {deadline}" title="due {due}">'
            f"{forecast.WORDS[deadline]}</span>"
        )
    waiting = (
        f' <span class="submitted-count" title="closed, waiting to merge">'
        f"◐ {s['submitted']} submitted</span>"
        if s.get("submitted")
        else ""
    ) + (
        f' <span class="skipped-count" title="closed as not needed">⤼ {s["skipped"]} skipped</span>'
        if s.get("skipped")
        else ""
    )
    href = escape(_convoy_url(context).replace("__ID__", quoted_url_segment(c.pk)))
    return mark_safe(  # noqa: S308 - each value above is escaped
        f'<tr data-convoy="{cid}" id="convoy-{cid}" class="convoy-row">\n'
        f'    <td class="pick"><input type="checkbox" name="ids" value="{cid}" '
        f'form="convoy-actions" aria-label="Select {cid}"></td>\n'
        f'    <td><a href="{href}"><code>{cid}</code></a> '
        f"{escape(formatting.convoy_title(c.title))}{tags}</td>\n"
        f'    <td class="progress">{bar(s)}</td>\n'
        f'    <td class="counts"><span class="done-count">{s["done"]}</span>/'
        f'<span class="total-count">{s["total"]}</span> '
        f'<span class="percent">{s["percent_complete"]}%</span>{waiting}</td>\n'
        f"    <td>{escape(formatting.person(c.owner) or '—')}</td>\n"
        f"    <td>{when(context, c.created_at)}</td>\n"
        f'    <td class="activity">{when(context, s["last_activity"])}</td>\n'
        f'    <td><span class="status {escape(c.status)}">{escape(convoy_state(c))}</span></td>\n'
        "  </tr>"
    )


def _convoy_url(context: Context) -> str:
    """reverse() once per render: a dashboard links two hundred convoys."""
    found: str | None = context.render_context.get("_convoy_url")
    if found is None:
        found = reverse("convoy", args=["__ID__"])
        context.render_context["_convoy_url"] = found  # for this render only
    return found
