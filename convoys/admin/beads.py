"""The bead's admin: its form, dependencies and labels, saved through the bead service."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from convoys.admin.base import (
    DEPENDENTS_SHOWN,
    PRIORITIES,
    TEXT_WIDGETS,
    ServiceAdmin,
    ServiceForm,
    ServiceInline,
    actor_of,
    choice_field,
    choices_keeping,
    each,
    inline_changes,
    rows_note,
)
from convoys.core.ids import id_problem
from convoys.models import (
    DONE_STATUSES,
    SETTABLE_STATUSES,
    Bead,
    Dependency,
)
from convoys.services import beads as bead_service

# bd's built-in issue types and Gas Town's orchestrator ones.
KNOWN_TYPES = (
    "task",
    "bug",
    "feature",
    "chore",
    "epic",
    "decision",
    "message",
    "molecule",
    "gate",
    "spike",
    "story",
    "milestone",
    "convoy",
    "merge-request",
    "agent",
    "role",
    "rig",
    "slot",
    "event",
)


class DependencyInline(ServiceInline):
    model = Dependency
    fk_name = "issue"
    extra = 1
    fields = ("depends_on_id", "type", "raw_target", "created_by")
    readonly_fields = ("raw_target", "created_by")
    verbose_name = "depends on"
    verbose_name_plural = "depends on (outgoing)"

    def _may_edit(self, request: HttpRequest, obj: models.Model | None) -> bool:
        # A sync source's bead: its dependencies are the source's too (shown, not editable).
        return super()._may_edit(request, obj) and not (
            isinstance(obj, Bead) and owning_source(obj)
        )


class LabelsField(forms.Field):
    """A bead's labels (a JSON list of strings) as text, one label per line."""

    widget = forms.Textarea(attrs={"rows": 3})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return "\n".join(str(label) for label in value)
        return value

    def to_python(self, value: str | None) -> list[str]:
        labels = []
        for line in (value or "").splitlines():
            label = line.strip()
            if label and label not in labels:
                labels.append(label)
        return labels


def owning_source(bead: Bead) -> str | None:
    """The sync source a bead comes from while that source still has it (then the fields bd
    owns are read-only here: change it in bd), else None. Kept on the instance."""
    if not hasattr(bead, "_owning_source"):
        record = bead.sourced if bead.pk else None
        # A per-instance cache, not a field.
        bead._owning_source = record.source if record and not record.missing_since else None  # type: ignore[attr-defined]
    source: str | None = bead._owning_source  # type: ignore[attr-defined]
    return source


BEAD_FORM_FIELDS = (
    "id",
    "title",
    "description",
    "status",
    "issue_type",
    "priority",
    "assignee",
    "owner",
    "labels",
    "close_reason",
)


class BeadAdminForm(ServiceForm):
    status = forms.ChoiceField()
    issue_type = forms.ChoiceField(required=False)
    priority = forms.TypedChoiceField(coerce=int)
    labels = LabelsField(required=False, help_text="One label per line.")
    close_anyway = forms.BooleanField(
        required=False,
        label="Close even with open blockers",
        help_text="A bead whose blockers are not done is closed only when this is ticked.",
    )

    class Meta:
        model = Bead
        fields = BEAD_FORM_FIELDS
        widgets = TEXT_WIDGETS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        bead = self.instance  # a new one has the model's defaults
        if "status" not in self.fields:
            return  # a sync source's bead: these fields are read-only
        for name in ("status", "issue_type", "priority"):
            self.fields[name].initial = getattr(bead, name)
        choice_field(self, "status").choices = choices_keeping(SETTABLE_STATUSES, bead.status)
        choice_field(self, "issue_type").choices = choices_keeping(
            KNOWN_TYPES, bead.issue_type, blank_label="(none: slingable)"
        )
        priorities = dict(PRIORITIES)
        priorities.setdefault(bead.priority, f"{bead.priority} (imported)")
        choice_field(self, "priority").choices = sorted(priorities.items())

    def clean_id(self) -> str:
        """The one id rule (convoys/core/ids.py) as a field error, before any service runs."""
        bead_id: str = self.cleaned_data["id"]
        problem = id_problem(bead_id)
        if problem:
            raise ValidationError(f"bead id {bead_id!r} {problem}")
        return bead_id


def save_bead(bead_id: str, form: forms.ModelForm[Any], actor: str) -> None:
    """A changed bead through the services: a close is close_bead (its event feeds the next
    bead), leaving closed is reopen_bead, anything else update_bead."""
    fields = {
        name: form.cleaned_data[name]
        for name in form.changed_data
        if name in bead_service.UPDATABLE
    }
    target = fields.pop("status", None)
    if target == "closed":
        fields.pop("close_reason", None)
        if fields:
            bead_service.update_bead(bead_id, actor=actor, **fields)
        bead_service.close_bead(
            bead_id,
            reason=form.cleaned_data["close_reason"],
            actor=actor,
            force=bool(form.cleaned_data.get("close_anyway")),
        )
        return
    reopening = form.initial["status"] in DONE_STATUSES and target not in (None, *DONE_STATUSES)
    if reopening:
        bead_service.reopen_bead(bead_id, actor=actor)
        target = None if target == "open" else target
    if target is not None:
        fields["status"] = target
    if fields:
        bead_service.update_bead(bead_id, actor=actor, **fields)


@admin.register(Bead)
class BeadAdmin(ServiceAdmin):
    form = BeadAdminForm
    list_display = (
        "id",
        "title",
        "status",
        "issue_type",
        "priority",
        "rig",
        "assignee",
        "updated_at",
    )
    list_filter = ("status", "issue_type", "rig", "priority")
    search_fields = ("id", "title")
    inlines = [DependencyInline]
    readonly_fields = (
        "dependency_count",
        "dependents",
        "created_at",
        "updated_at",
        "closed_at",
        "rig",
        "imported_fields",
        "source",
    )
    fields = (
        "source",
        *BEAD_FORM_FIELDS,
        "close_anyway",
        "rig",
        "dependency_count",
        "dependents",
        "created_at",
        "updated_at",
        "closed_at",
        "imported_fields",
    )
    actions = ["close_selected", "reopen_selected"]
    list_per_page = 100

    def get_readonly_fields(self, request: HttpRequest, obj: Bead | None = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))
        if obj is None:
            return fields
        if owning_source(obj):  # the source owns every field bd has
            return fields + [f for f in BEAD_FORM_FIELDS if f not in fields]
        return fields + ["id"]

    def get_fields(
        self, request: HttpRequest, obj: Bead | None = None
    ) -> list[Any] | tuple[Any, ...]:
        fields = super().get_fields(request, obj)
        # What the form does not offer: a new bead has no source, and only an editable
        # bead that is not done can be closed with its blockers open.
        dropped = {"source", "close_anyway"} if obj is None else set()
        if obj is not None and (owning_source(obj) or obj.status in DONE_STATUSES):
            dropped.add("close_anyway")
        return [f for f in fields if f not in dropped]

    @admin.display(description="source")
    def source(self, obj: Bead) -> str:
        record = obj.sourced if obj.pk else None
        if record is None:
            return "— (created in convoyweb: editable here)"
        if record.missing_since:
            return format_html(
                "<code>{}</code> · <strong>missing from its source</strong> since {}: "
                "editable here",
                record.source,
                record.missing_since.strftime("%Y-%m-%d %H:%M UTC"),
            )
        return format_html(
            "<code>{}</code> · owned by its source, read-only here: <strong>change it in "
            "bd</strong>",
            record.source,
        )

    @admin.display(description="depends on")
    def dependency_count(self, obj: Bead) -> str:
        total = Dependency.objects.filter(issue_id=obj.pk).count() if obj.pk else 0
        return rows_note(total, ("dependency", "dependencies"), "the bead's page")

    @admin.display(description="dependents (incoming)")
    def dependents(self, obj: Bead) -> str:
        rows = Dependency.objects.filter(depends_on_id=obj.pk).order_by("issue_id")
        total = rows.count()
        if not total:
            return "—"
        shown = format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                "<li>{} <code>{}</code></li>",
                ((d.issue_id, d.type) for d in rows[:DEPENDENTS_SHOWN]),
            ),
        )
        if total <= DEPENDENTS_SHOWN:
            return shown
        return format_html("{}<p>… and {} more</p>", shown, total - DEPENDENTS_SHOWN)

    @admin.display(description="extra (imported fields, read-only)")
    def imported_fields(self, obj: Bead) -> str:
        if not obj.extra:
            return "—"
        text = json.dumps(obj.extra, indent=2, sort_keys=True, ensure_ascii=False)
        return format_html("<pre>{}</pre>", text)

    def save_model(
        self, request: HttpRequest, obj: Bead, form: BeadAdminForm, change: bool
    ) -> None:
        actor = actor_of(request)
        if change and owning_source(obj):
            # Its fields are read-only here, so the page sends none: a POST that does (a page
            # loaded before the bead came from a source, or forged) is refused, naming it.
            if set(request.POST) & set(BEAD_FORM_FIELDS):
                bead_service.refuse_sourced(obj.pk)
            return
        if change:
            save_bead(obj.pk, form, actor)
            return
        data = form.cleaned_data
        created = bead_service.create_bead(
            data["title"],
            bead_id=data["id"],
            description=data["description"],
            issue_type=data["issue_type"],
            priority=data["priority"],
            status=data["status"],
            assignee=data["assignee"],
            labels=data["labels"],
            actor=actor,
        )
        obj.id = created.id
        rest = {name: data[name] for name in ("owner", "close_reason") if data[name]}
        if rest:
            bead_service.update_bead(created.id, actor=actor, **rest)

    def save_formset(
        self,
        request: HttpRequest,
        form: BeadAdminForm,
        formset: BaseInlineFormSet[Any, Any, Any],
        change: bool,
    ) -> None:
        actor, bead_id = actor_of(request), form.instance.pk
        deleted, changed, added = inline_changes(formset)
        for row in deleted:
            bead_service.remove_dependency(bead_id, row.initial["depends_on_id"], actor=actor)
            formset.deleted_objects.append(row.instance)
        for row in changed:
            bead_service.remove_dependency(bead_id, row.initial["depends_on_id"], actor=actor)
            dep = bead_service.add_dependency(
                bead_id, row.cleaned_data["depends_on_id"], row.cleaned_data["type"], actor=actor
            )
            formset.changed_objects.append((dep, row.changed_data))
        for row in added:
            dep = bead_service.add_dependency(
                bead_id, row.cleaned_data["depends_on_id"], row.cleaned_data["type"], actor=actor
            )
            formset.new_objects.append(dep)

    @admin.action(description="Close selected beads", permissions=["change"])
    def close_selected(self, request: HttpRequest, queryset: QuerySet[Bead]) -> None:
        each(self, request, queryset.exclude(status="closed"), bead_service.close_bead, "Closed")

    @admin.action(description="Reopen selected beads", permissions=["change"])
    def reopen_selected(self, request: HttpRequest, queryset: QuerySet[Bead]) -> None:
        each(
            self,
            request,
            queryset.filter(status__in=DONE_STATUSES),
            bead_service.reopen_bead,
            "Reopened",
        )
