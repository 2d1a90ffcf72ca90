"""Django admin: every save and action goes through the services, so it writes events."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.utils.html import format_html, format_html_join

from .models import (
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
from .services import beads as bead_service
from .services import convoys as convoy_service
from .services import rigs as rig_service
from .services.errors import ServiceError


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class DependencyInline(admin.TabularInline):
    model = Dependency
    fk_name = "issue"
    extra = 1
    fields = ("depends_on_id", "type", "raw_target", "created_by")
    readonly_fields = ("raw_target", "created_by")
    verbose_name = "depends on"
    verbose_name_plural = "depends on (outgoing)"


@admin.register(Bead)
class BeadAdmin(admin.ModelAdmin):
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
    readonly_fields = ("dependents", "created_at", "updated_at", "closed_at", "rig")
    fields = (
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
        "rig",
        "dependents",
        "created_at",
        "updated_at",
        "closed_at",
        "extra",
    )
    actions = ["close_selected", "reopen_selected"]
    list_per_page = 100

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        return fields + ["id"] if obj else fields

    @admin.display(description="dependents (incoming)")
    def dependents(self, obj):
        rows = Dependency.objects.filter(depends_on_id=obj.pk).order_by("issue_id")
        if not rows:
            return "—"
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "", "<li>{} <code>{}</code></li>", ((d.issue_id, d.type) for d in rows)
            ),
        )

    def save_model(self, request, obj, form, change):
        actor = f"admin:{request.user.username}"
        try:
            if not change:
                bead_service.create_bead(
                    obj.title,
                    bead_id=obj.id,
                    description=obj.description,
                    issue_type=obj.issue_type,
                    priority=obj.priority,
                    status=obj.status,
                    assignee=obj.assignee,
                    labels=obj.labels,
                    actor=actor,
                )
                return
            fields = {
                name: form.cleaned_data[name]
                for name in form.changed_data
                if name in bead_service.UPDATABLE
            }
            if fields:
                bead_service.update_bead(obj.pk, actor=actor, **fields)
        except ServiceError as exc:
            raise ValidationError(str(exc))

    def save_formset(self, request, form, formset, change):
        actor = f"admin:{request.user.username}"
        for inline_form in formset.forms:
            if not inline_form.has_changed() and not inline_form.cleaned_data.get("DELETE"):
                continue
            data = inline_form.cleaned_data
            if not data:
                continue
            instance = inline_form.instance
            if data.get("DELETE") and instance.pk:
                bead_service.remove_dependency(form.instance.pk, instance.depends_on_id, actor)
            elif not instance.pk:
                bead_service.add_dependency(
                    form.instance.pk, data["depends_on_id"], data.get("type") or "blocks", actor
                )
            else:
                bead_service.remove_dependency(
                    form.instance.pk, inline_form.initial["depends_on_id"], actor
                )
                bead_service.add_dependency(
                    form.instance.pk, data["depends_on_id"], data.get("type") or "blocks", actor
                )

    def _bulk(self, request, queryset, action, verb):
        done, failed = 0, []
        for bead in queryset:
            try:
                action(bead.pk, actor=f"admin:{request.user.username}")
                done += 1
            except ServiceError as exc:
                failed.append(str(exc))
        self.message_user(request, f"{verb} {done} bead(s).")
        for message in failed[:10]:
            self.message_user(request, message, messages.WARNING)

    @admin.action(description="Close selected beads", permissions=["change"])
    def close_selected(self, request, queryset):
        self._bulk(request, queryset.exclude(status="closed"), bead_service.close_bead, "Closed")

    @admin.action(description="Reopen selected beads", permissions=["change"])
    def reopen_selected(self, request, queryset):
        self._bulk(
            request,
            queryset.filter(status__in=("closed", "tombstone")),
            bead_service.reopen_bead,
            "Reopened",
        )


class TrackedInline(admin.TabularInline):
    model = TrackedBead
    extra = 1
    fields = ("bead_id", "position", "raw_target")
    readonly_fields = ("raw_target",)


CONVOY_EDITABLE = (
    "title",
    "status",
    "owner",
    "notify",
    "owned",
    "merge_strategy",
    "base_branch",
    "molecule",
    "max_in_flight",
    "description",
    "close_reason",
)


class ConvoyAdminForm(forms.ModelForm):
    class Meta:
        model = Convoy
        fields = CONVOY_EDITABLE

    def clean_status(self):
        """Status changes in admin obey the same transition table as everywhere else."""
        target = self.cleaned_data["status"]
        if self.instance.pk:
            try:
                return convoy_service.check_transition(self.instance.status, target)
            except ServiceError as exc:
                raise ValidationError(str(exc))
        return target


@admin.register(Convoy)
class ConvoyAdmin(admin.ModelAdmin):
    form = ConvoyAdminForm
    list_display = ("id", "title", "status", "owner", "created_at", "closed_at")
    list_filter = ("status", "owned")
    search_fields = ("id", "title")
    inlines = [TrackedInline]
    readonly_fields = ("id", "created_at", "updated_at", "closed_at", "completion_notified_at")
    fields = (
        "id",
        *CONVOY_EDITABLE,
        "created_at",
        "updated_at",
        "closed_at",
        "completion_notified_at",
    )

    def has_add_permission(self, request):
        return False  # convoys are created by staging, sling or `convoy create`

    def save_model(self, request, obj, form, change):
        actor = f"admin:{request.user.username}"
        original = Convoy.objects.get(pk=obj.pk)
        try:
            if "status" in form.changed_data:
                target = obj.status
                convoy_service.check_transition(original.status, target)
                if target == "closed":
                    convoy_service.close(
                        obj.pk,
                        reason=obj.close_reason or "Closed in admin",
                        force=True,
                        actor=actor,
                    )
                else:
                    convoy_service.set_status(original, target, actor=actor)
            others = [f for f in form.changed_data if f != "status"]
            if others:
                Convoy.objects.filter(pk=obj.pk).update(**{f: getattr(obj, f) for f in others})
        except ServiceError as exc:
            raise ValidationError(str(exc))

    def save_formset(self, request, form, formset, change):
        added = []
        for inline_form in formset.forms:
            data = inline_form.cleaned_data
            if data and not inline_form.instance.pk and not data.get("DELETE"):
                added.append(data["bead_id"])
            elif data and data.get("DELETE") and inline_form.instance.pk:
                inline_form.instance.delete()
        if added:
            convoy_service.add(form.instance.pk, added, actor=f"admin:{request.user.username}")


@admin.register(Rig)
class RigAdmin(admin.ModelAdmin):
    list_display = ("name", "state")
    list_filter = ("state",)

    def save_model(self, request, obj, form, change):
        if change and "state" in form.changed_data:
            rig_service.set_rig_state(obj.name, obj.state, actor=f"admin:{request.user.username}")
        else:
            super().save_model(request, obj, form, change)


@admin.register(Route)
class RouteAdmin(admin.ModelAdmin):
    list_display = ("prefix", "path", "rig")
    fields = ("prefix", "path")

    def save_model(self, request, obj, form, change):
        rig_service.upsert_route(obj.prefix, obj.path)


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


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ("user", "convoy", "email")


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ("subject", "user", "address", "kind", "created_at", "read_at")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "created_at")
    readonly_fields = ("digest",)
