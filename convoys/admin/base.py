"""What every admin page here shares: saves through a service, refusals shown as form errors,
inlines that write through services and show their first rows, search that tells what it
matched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ERROR_FLAG, SEARCH_VAR
from django.contrib.auth import get_permission_codename
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from convoys.core.formatting import several
from convoys.read.dashboard import filter_text
from convoys.services.errors import ServiceError

if TYPE_CHECKING:  # django-stubs' generic classes; Django's own take no parameters at run time
    ModelAdmin = admin.ModelAdmin[Any]
    TabularInline = admin.TabularInline[Any, Any]
    ModelForm = forms.ModelForm[Any]
    InlineFormSet = BaseInlineFormSet[Any, Any, Any]
else:
    ModelAdmin = admin.ModelAdmin
    TabularInline = admin.TabularInline
    ModelForm = forms.ModelForm
    InlineFormSet = BaseInlineFormSet


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


def refusal(exc: ServiceError) -> str:
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
            failed.append(f"{obj.pk}: {refusal(exc)}")
    opts = model_admin.opts
    noun = several(done, str(opts.verbose_name), str(opts.verbose_name_plural))
    model_admin.message_user(request, f"{verb} {noun}.")
    for message in failed[:10]:
        model_admin.message_user(request, message, messages.WARNING)


class SearchAdmin(ModelAdmin):
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


class ServiceForm(ModelForm):
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
            request.service_refusal = refusal(exc)  # type: ignore[attr-defined]
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


class FirstRowsFormSet(InlineFormSet):
    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_queryset"):
            self._queryset = super().get_queryset()[:INLINE_ROWS]
        return self._queryset

    def add_fields(self, form: forms.BaseForm, index: int | None) -> None:
        """A tabular inline names its columns in a header row, not a <label> per cell: each
        control is named for assistive technology by its column (and row)."""
        super().add_fields(form, index)
        row = "new row" if index is None else f"row {index + 1}"
        for field in form.fields.values():
            field.widget.attrs.setdefault("aria-label", f"{field.label} ({row})")


def rows_note(total: int, nouns: tuple[str, str], where: str) -> str:
    noun = nouns[0] if total == 1 else nouns[1]
    if total <= INLINE_ROWS:
        return f"{total} {noun}"
    return f"{total} {noun}; the first {INLINE_ROWS} are editable below, all of them on {where}"


class ServiceInline(TabularInline):
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


def choice_field(form: forms.BaseForm, name: str) -> forms.ChoiceField:
    """A choice field of `form` (declared as one), to set its choices."""
    return cast(forms.ChoiceField, form.fields[name])
