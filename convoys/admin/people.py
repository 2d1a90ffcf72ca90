"""What belongs to people: subscriptions, notifications and API tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from convoys.admin.base import ModelAdmin, ModelForm, ReadOnlyAdmin
from convoys.models import (
    ApiToken,
    Notification,
    Subscription,
)
from convoys.services import notify
from convoys.services.tokens import create_token, digest, rename_token
from convoys.services.tokens import revoke as revoke_token

if TYPE_CHECKING:
    from django.contrib.auth.models import User


class SubscriptionAdminForm(ModelForm):
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
class SubscriptionAdmin(ModelAdmin):
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
class ApiTokenAdmin(ModelAdmin):
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
