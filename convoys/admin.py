"""Django admin: every save goes through convoys/services, so it obeys their rules and writes
their events.

A save runs in one transaction (ModelAdmin.changeform_view), the object and its inlines
together. When a service refuses (ServiceError), the exception leaves that transaction, which
rolls back everything the save wrote; the same POST is then rendered again with the refusal as
a form error. Services know nothing about forms; the admin never writes model rows itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ERROR_FLAG, SEARCH_VAR
from django.contrib.auth import get_permission_codename, get_user_model
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from convoys.core import formatting
from convoys.core.formatting import several
from convoys.core.ids import id_problem
from convoys.models import (
    CONVOY_CLOSED,
    CONVOY_OPEN,
    CONVOY_STATUSES,
    DONE_STATUSES,
    KNOWN_STATUSES,
    STAGED_STATUSES,
    ApiToken,
    Bead,
    Convoy,
    Dependency,
    Dispatch,
    Event,
    Notification,
    Rig,
    Route,
    Subscription,
    TrackedBead,
    Worker,
)
from convoys.read.dashboard import filter_text
from convoys.services import beads as bead_service
from convoys.services import convoys as convoy_service
from convoys.services import launch, notify
from convoys.services import rigs as rig_service
from convoys.services.errors import ServiceError
from convoys.services.tokens import create_token, digest, rename_token
from convoys.services.tokens import revoke as revoke_token

if TYPE_CHECKING:  # django-stubs' generic classes; Django's own take no parameters at run time
    from django.contrib.auth.models import User

    _ModelAdmin = admin.ModelAdmin[Any]
    _TabularInline = admin.TabularInline[Any, Any]
    _ModelForm = forms.ModelForm[Any]
    _InlineFormSet = BaseInlineFormSet[Any, Any, Any]
else:
    _ModelAdmin = admin.ModelAdmin
    _TabularInline = admin.TabularInline
    _ModelForm = forms.ModelForm
    _InlineFormSet = BaseInlineFormSet

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
# Inline rows shown: a 1,000-bead convoy (or an imported bead with 140,000 dependencies) stays a
# page that renders in well under a second; the parent form says how many there are.
INLINE_ROWS = 100
PRIORITIES = ((0, "0 (most urgent)"), (1, "1"), (2, "2"), (3, "3"), (4, "4 (least urgent)"))
DEPENDENTS_SHOWN = 100


def actor_of(request: HttpRequest) -> str:
    return f"admin:{request.user.username}"


def choices_keeping(
    known: Iterable[Any], current: Any, blank_label: str | None = None
) -> list[tuple[Any, Any]]:
    """Choices for a free-string field: the known values, plus the current one when an import
    brought a value we do not know (kept and shown, never silently replaced)."""
    values = list(known)
    if blank_label is not None:
        values.insert(0, "")
    if current is not None and current not in values:
        values.append(current)
    return [(v, blank_label if v == "" else v if v in known else f"{v} (imported)") for v in values]


def _refusal(exc: ServiceError) -> str:
    """A service's refusal in the admin's words (how to go on here)."""
    return exc.explained("admin")


def each(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Any],
    action: Callable[..., object],
    verb: str,
) -> None:
    """A list action: the service for each selected row, each in its own transaction (outside
    the changelist's); refusals are listed, the others still done."""
    done, failed = 0, []
    for obj in queryset:
        try:
            action(obj.pk, actor=actor_of(request))
            done += 1
        except ServiceError as exc:
            failed.append(f"{obj.pk}: {_refusal(exc)}")
    opts = model_admin.opts
    noun = several(done, str(opts.verbose_name), str(opts.verbose_name_plural))
    model_admin.message_user(request, f"{verb} {noun}.")
    for message in failed[:10]:
        model_admin.message_user(request, message, messages.WARNING)


class SearchAdmin(_ModelAdmin):
    """Search text as the pages take it (NUL dropped, length capped)."""

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        return super().get_search_results(request, queryset, filter_text(search_term))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # A filter value with a NUL matches no row, and PostgreSQL cannot even compare it:
        # the admin's own answer to an invalid lookup (the list, unfiltered, with ?e=1).
        filters = [(k, v) for k, vs in request.GET.lists() if k != SEARCH_VAR for v in vs]
        if any("\x00" in k or "\x00" in v for k, v in filters):
            return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")
        return super().changelist_view(request, extra_context)


class ReadOnlyAdmin(SearchAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False


# Titles and reasons are a line or two, not the TextField's big box; still text areas, as an
# imported title may hold a newline that a one-line input would silently drop.
TEXT_WIDGETS = {
    "title": forms.Textarea(attrs={"rows": 2, "cols": 80}),
    "close_reason": forms.Textarea(attrs={"rows": 2, "cols": 80}),
}


class StoredTextField(forms.CharField):
    """Text as stored: browsers send a textarea's line breaks as CRLF and the default field
    strips the ends, so an unchanged multi-line description would come back "changed"."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "strip": False})

    def to_python(self, value: Any) -> Any:
        value = super().to_python(value)
        return value.replace("\r\n", "\n") if isinstance(value, str) else value


class ServiceForm(_ModelForm):
    """A form whose save was refused by a service shows the reason as a non-field error."""

    refusal: str | None = None

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        if self.refusal:
            raise ValidationError(self.refusal)
        return cleaned


class ServiceAdmin(SearchAdmin):
    """Saves through services; rows are never deleted behind the services' back."""

    form = ServiceForm

    def formfield_for_dbfield(
        self, db_field: models.Field[Any, Any], request: HttpRequest, **kwargs: Any
    ) -> forms.Field | None:
        if isinstance(db_field, models.TextField):
            kwargs["form_class"] = StoredTextField
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def get_form(
        self,
        request: HttpRequest,
        obj: models.Model | None = None,
        change: bool = False,
        **kwargs: Any,
    ) -> type[ServiceForm]:
        # self.form is a ServiceForm (this class's or a subclass's): get_form derives from it.
        form = cast("type[ServiceForm]", super().get_form(request, obj, change, **kwargs))
        form.refusal = getattr(request, "service_refusal", None)
        return form

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ServiceError as exc:
            # The refusal left the admin's transaction: nothing of this save was kept.
            # Carried on the request to get_form of the second rendering.
            request.service_refusal = _refusal(exc)  # type: ignore[attr-defined]
            return super().changeform_view(request, object_id, form_url, extra_context)

    def has_delete_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False


def inline_changes(
    formset: BaseInlineFormSet[Any, Any, Any],
) -> tuple[list[forms.ModelForm[Any]], list[forms.ModelForm[Any]], list[forms.ModelForm[Any]]]:
    """A valid inline formset as (deleted, changed, added) forms; unchanged rows are left out.

    The formset's new/changed/deleted_objects (read by the admin's change message) start empty
    and are filled by the caller as its services write."""
    formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
    deleted: list[forms.ModelForm[Any]] = []
    changed: list[forms.ModelForm[Any]] = []
    added: list[forms.ModelForm[Any]] = []
    for form in formset.initial_forms:
        if form.cleaned_data.get("DELETE"):
            deleted.append(form)
        elif form.has_changed():
            changed.append(form)
    for form in formset.extra_forms:
        if form.has_changed() and not form.cleaned_data.get("DELETE"):
            added.append(form)
    return deleted, changed, added


class FirstRowsFormSet(_InlineFormSet):
    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_queryset"):
            self._queryset = super().get_queryset()[:INLINE_ROWS]
        return self._queryset


def rows_note(total: int, nouns: tuple[str, str], where: str) -> str:
    noun = nouns[0] if total == 1 else nouns[1]
    if total <= INLINE_ROWS:
        return f"{total} {noun}"
    return f"{total} {noun}; the first {INLINE_ROWS} are editable below, all of them on {where}"


class ServiceInline(_TabularInline):
    """Inline rows are written by the parent's services, so the parent's permissions apply.
    Only the first INLINE_ROWS rows are shown."""

    formset = FirstRowsFormSet

    def _parent_may(self, request: HttpRequest, action: str) -> bool:
        opts = self.parent_model._meta
        return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")

    def _may_edit(self, request: HttpRequest, obj: models.Model | None) -> bool:
        return self._parent_may(request, "change") or (
            obj is None and self._parent_may(request, "add")
        )

    # InlineModelAdmin's own signature, which the stubs also mark as an override of
    # BaseModelAdmin's (one argument fewer).
    def has_add_permission(self, request: HttpRequest, obj: models.Model | None) -> bool:  # type: ignore[override]
        return self._may_edit(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return self._may_edit(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return self._may_edit(request, obj)

    def has_view_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return self._may_edit(request, obj) or self._parent_may(request, "view")


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


def _choices(form: forms.BaseForm, name: str) -> forms.ChoiceField:
    """A choice field of `form` (declared as one), to set its choices."""
    return cast(forms.ChoiceField, form.fields[name])


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
        _choices(self, "status").choices = choices_keeping(KNOWN_STATUSES, bead.status)
        _choices(self, "issue_type").choices = choices_keeping(
            KNOWN_TYPES, bead.issue_type, blank_label="(none: slingable)"
        )
        priorities = dict(PRIORITIES)
        priorities.setdefault(bead.priority, f"{bead.priority} (imported)")
        _choices(self, "priority").choices = sorted(priorities.items())

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


class TrackedInline(ServiceInline):
    model = TrackedBead
    extra = 1
    fields = ("bead_id", "position", "raw_target")
    readonly_fields = ("position", "raw_target")
    verbose_name = "tracked bead"


CONVOY_FORM_FIELDS = ("title", "status", *(f for f in convoy_service.EDITABLE if f != "title"))


class ConvoyAdminForm(ServiceForm):
    status = forms.ChoiceField()
    merge_strategy = forms.ChoiceField(required=False)
    max_in_flight = forms.IntegerField(
        required=False,
        min_value=1,
        help_text="Dispatches a close may top up to; empty: one per close.",
    )

    class Meta:
        model = Convoy
        fields = CONVOY_FORM_FIELDS
        widgets = TEXT_WIDGETS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        convoy = self.instance
        # Only the moves the transition table allows from here, in words; launch and re-stage
        # have their own pages and commands, so a staged convoy may only be cancelled here.
        allowed = admin_statuses(convoy.status)
        field = _choices(self, "status")
        field.choices = [
            (value, label if label.endswith("(imported)") else formatting.status_words(value))
            for value, label in choices_keeping(CONVOY_STATUSES, convoy.status)
            if value in allowed
        ]
        field.error_messages["invalid_choice"] = self.transition_error(convoy.status)
        _choices(self, "merge_strategy").choices = choices_keeping(
            Convoy.MERGE_STRATEGIES, convoy.merge_strategy, blank_label="(none)"
        )

    def transition_error(self, current: str) -> str:
        """A refused status change, for people: what the convoy is and may become here."""
        others = [s for s in admin_statuses(current) if s != current]
        now = formatting.status_words(current)
        if current in STAGED_STATUSES:
            return (
                f"A convoy {now} can only be closed (cancelled) here: launch it with the "
                f"Launch action of the convoy list, its page /convoys/{self.instance.pk}/ or "
                "`convoy launch`, and re-stage it with `convoy stage`."
            )
        if not others:
            return f"A convoy whose status is “{current}” cannot change status here."
        return f"A convoy that is {now} can only become {formatting.status_words(others[0])} here."

    def clean_status(self) -> str:
        """The one transition table (services), as offered by the choices; a forged value
        is refused with the same words."""
        target: str = self.cleaned_data["status"]
        current = self.instance.status
        if target == current:
            return target
        try:
            convoy_service.check_transition(current, target)
        except ServiceError:
            raise ValidationError(self.transition_error(current))
        if target not in admin_statuses(current):
            raise ValidationError(self.transition_error(current))
        return target


def admin_statuses(current: str) -> list[str]:
    """The statuses the admin offers a convoy in `current`: itself and the moves of the one
    transition table, except launch and re-stage (a staged convoy may only be closed here)."""
    legal = convoy_service.TRANSITIONS.get(current)
    if legal is None:  # an imported status we do not know: shown, kept, not changed here
        return [current]
    if current in STAGED_STATUSES:
        legal = {current, CONVOY_CLOSED}
    return [s for s in CONVOY_STATUSES if s in legal]


CONVOY_SHOWN = ("tracked_count", "created_at", "updated_at", "closed_at", "completion_notified_at")


@admin.register(Convoy)
class ConvoyAdmin(ServiceAdmin):
    form = ConvoyAdminForm
    list_display = ("id", "title", "status", "owner", "created_at", "closed_at")
    list_filter = ("status", "owned")
    search_fields = ("id", "title")
    inlines = [TrackedInline]
    readonly_fields = ("id", *CONVOY_SHOWN)
    fields = ("id", *CONVOY_FORM_FIELDS, *CONVOY_SHOWN)

    actions = ["launch_selected", "launch_selected_forced"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # convoys are created by staging, sling or `convoy create`

    @admin.action(description="Launch selected staged convoys", permissions=["change"])
    def launch_selected(self, request: HttpRequest, queryset: QuerySet[Convoy]) -> None:
        each(self, request, queryset, launch.launch_staged, "Launched")

    @admin.action(
        description="Launch selected staged convoys, even with warnings or parked rigs",
        permissions=["change"],
    )
    def launch_selected_forced(self, request: HttpRequest, queryset: QuerySet[Convoy]) -> None:
        forced = partial(launch.launch_staged, force=True)
        each(self, request, queryset, forced, "Launched")

    @admin.display(description="tracks")
    def tracked_count(self, obj: Convoy) -> str:
        return rows_note(obj.tracked.count(), ("bead", "beads"), "the convoy's page")

    def save_model(
        self, request: HttpRequest, obj: Convoy, form: ConvoyAdminForm, change: bool
    ) -> None:
        actor, data = actor_of(request), form.cleaned_data
        fields = {name: data[name] for name in form.changed_data if name != "status"}
        target = data["status"] if "status" in form.changed_data else None
        if target == CONVOY_CLOSED:
            fields.pop("close_reason", None)
        if fields:
            convoy_service.update_fields(obj.pk, actor=actor, **fields)
        if target == CONVOY_CLOSED:
            reason = data["close_reason"] or "Closed in admin"
            convoy_service.close(obj.pk, reason=reason, force=True, actor=actor)
        elif target == CONVOY_OPEN:
            convoy_service.reopen(obj.pk, actor=actor)

    def save_formset(
        self,
        request: HttpRequest,
        form: ConvoyAdminForm,
        formset: BaseInlineFormSet[Any, Any, Any],
        change: bool,
    ) -> None:
        actor, convoy_id = actor_of(request), form.instance.pk
        deleted, changed, added = inline_changes(formset)
        gone = [row.initial["bead_id"] for row in deleted + changed]
        if gone:
            convoy_service.untrack(convoy_id, gone, actor=actor)
            formset.deleted_objects.extend(row.instance for row in deleted)
        new = [row.cleaned_data["bead_id"] for row in changed + added]
        if new:
            convoy_service.add(convoy_id, new, actor=actor)
            formset.changed_objects.extend((row.instance, row.changed_data) for row in changed)
            formset.new_objects.extend(row.instance for row in added)


class RigAdminForm(ServiceForm):
    class Meta:
        model = Rig
        fields = ("name", "state")


@admin.register(Rig)
class RigAdmin(ServiceAdmin):
    form = RigAdminForm
    list_display = ("name", "state")
    list_filter = ("state",)

    def get_readonly_fields(self, request: HttpRequest, obj: Rig | None = None) -> tuple[str, ...]:
        return ("name",) if obj else ()

    def save_model(self, request: HttpRequest, obj: Rig, form: RigAdminForm, change: bool) -> None:
        if not change:
            rig_service.create_rig(obj.name, obj.state, actor=actor_of(request))
        elif "state" in form.changed_data:
            rig_service.set_rig_state(obj.name, obj.state, actor=actor_of(request))


class RouteAdminForm(ServiceForm):
    class Meta:
        model = Route
        fields = ("prefix", "path")


@admin.register(Route)
class RouteAdmin(ServiceAdmin):
    form = RouteAdminForm
    list_display = ("prefix", "path", "rig")
    fields = ("prefix", "path", "rig")
    readonly_fields = ("rig",)

    def get_readonly_fields(
        self, request: HttpRequest, obj: Route | None = None
    ) -> tuple[str, ...]:
        return ("prefix", "rig") if obj else ("rig",)

    def save_model(
        self, request: HttpRequest, obj: Route, form: RouteAdminForm, change: bool
    ) -> None:
        obj.rig_id = rig_service.upsert_route(obj.prefix, obj.path, actor=actor_of(request))


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("seq", "kind", "bead_id", "convoy_id", "actor", "created_at")
    list_filter = ("kind",)
    search_fields = ("bead_id", "convoy_id")


@admin.register(Dispatch)
class DispatchAdmin(ReadOnlyAdmin):
    list_display = (
        "bead_id",
        "convoy_id",
        "worker",
        "path",
        "ok",
        "error",
        "duration_ms",
        "created_at",
    )
    list_filter = ("path", "ok")
    search_fields = ("bead_id", "convoy_id", "worker")


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ("name", "rig", "last_seen")


class SubscriptionAdminForm(_ModelForm):
    class Meta:
        model = Subscription
        fields = ("user", "convoy", "email")

    def clean(self) -> dict[str, Any] | None:
        """Landing reports reach only users who may view convoys: say so instead of saving a
        subscription that would never deliver."""
        cleaned = super().clean()  # self.cleaned_data
        user = self.cleaned_data.get("user")
        if user is not None and not (user.is_active and user.has_perm("convoys.view_convoy")):
            raise ValidationError(
                f"{user} may not view convoys, so no landing report would reach them"
            )
        return cleaned


@admin.register(Subscription)
class SubscriptionAdmin(_ModelAdmin):
    form = SubscriptionAdminForm
    list_display = ("user", "convoy", "email")

    def save_model(
        self, request: HttpRequest, obj: Subscription, form: SubscriptionAdminForm, change: bool
    ) -> None:
        if change and {"user", "convoy"} & set(form.changed_data):
            before = Subscription.objects.get(pk=obj.pk)
            notify.unsubscribe(before.user, before.convoy)
        obj.pk = notify.subscribe(obj.user, obj.convoy, email=obj.email).pk


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ("subject", "user", "address", "kind", "created_at", "read_at")


@admin.register(ApiToken)
class ApiTokenAdmin(_ModelAdmin):
    """A token's user is chosen once, at creation (non-superusers: only themselves), and never
    changed: rebinding a token would let its holder act as someone else. The raw token is
    shown once, on the page after creation; only its SHA-256 is stored."""

    list_display = ("name", "user", "created_at", "expires_at", "last_used_at")
    fields = ("user", "name", "expires_at", "created_at", "last_used_at")

    def get_readonly_fields(
        self, request: HttpRequest, obj: ApiToken | None = None
    ) -> tuple[str, ...]:
        fixed = ("created_at", "last_used_at")
        return ("user", "expires_at", *fixed) if obj else fixed

    def formfield_for_foreignkey(
        self, db_field: models.ForeignKey[Any, Any], request: HttpRequest, **kwargs: Any
    ) -> forms.ModelChoiceField[Any] | None:
        if db_field.name == "user" and not request.user.is_superuser:
            user = cast("User", request.user)  # the admin's views need a signed-in staff user
            kwargs["queryset"] = get_user_model().objects.filter(pk=user.pk)
            kwargs["initial"] = user.pk
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(
        self, request: HttpRequest, obj: ApiToken, form: forms.ModelForm[Any], change: bool
    ) -> None:
        if change:
            rename_token(obj.pk, obj.name)
            return
        token = create_token(obj.user, obj.name, expires_at=obj.expires_at)
        saved = ApiToken.objects.get(digest=digest(token))
        obj.pk, obj.digest, obj.created_at = saved.pk, saved.digest, saved.created_at
        request.new_api_token = token  # type: ignore[attr-defined]  # for response_add, next

    def delete_model(self, request: HttpRequest, obj: ApiToken) -> None:
        revoke_token(obj.pk)  # revoking is deleting: the token stops working at once

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for pk in queryset.values_list("pk", flat=True):
            revoke_token(pk)

    def response_add(
        self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "API token created",
            "token": request.new_api_token,  # type: ignore[attr-defined]  # set by save_model
            "token_row": obj,
        }
        return TemplateResponse(request, "admin/convoys/apitoken/created.html", context)
