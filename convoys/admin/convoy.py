"""The convoy's admin: its form and tracked beads, saved through the convoy service; stage and
launch from the list.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest

from convoys.admin.base import (
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
from convoys.core import formatting
from convoys.models import (
    CONVOY_CLOSED,
    CONVOY_OPEN,
    CONVOY_STATUSES,
    STAGED_STATUSES,
    Convoy,
    TrackedBead,
)
from convoys.services import convoys as convoy_service
from convoys.services import launch
from convoys.services.errors import ServiceError


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
        field = choice_field(self, "status")
        field.choices = [
            (value, label if label.endswith("(imported)") else formatting.status_words(value))
            for value, label in choices_keeping(CONVOY_STATUSES, convoy.status)
            if value in allowed
        ]
        field.error_messages["invalid_choice"] = self.transition_error(convoy.status)
        choice_field(self, "merge_strategy").choices = choices_keeping(
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
