"""Admin for the scheduler: settings (validated like the API), cycle records, team usage."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from fleet.errors import ApplicationError
from scheduler.cycle.config import (
    settings_update,
    validate_params,
    validate_policy,
    validate_tick,
)
from scheduler.models import CycleRecord, SchedulerSettings, TeamUsage


class SchedulerSettingsForm(forms.ModelForm):
    class Meta:
        model = SchedulerSettings
        fields = ["policy", "params", "tick_seconds"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        checks = (
            ("policy", validate_policy),
            ("params", validate_params),
            ("tick_seconds", validate_tick),
        )
        for name, check in checks:
            if name in data:
                try:
                    data[name] = check(data[name])
                except ApplicationError as error:
                    self.add_error(name, error.message)
        return data


@admin.register(SchedulerSettings)
class SchedulerSettingsAdmin(admin.ModelAdmin):
    form = SchedulerSettingsForm
    list_display = ["policy", "tick_seconds", "updated_at", "updated_by"]
    readonly_fields = ["updated_at", "updated_by"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not SchedulerSettings.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        # Through the service, so the beat tick follows the interval.
        settings_update(
            user=request.user,
            policy=obj.policy,
            params=obj.params,
            tick_seconds=obj.tick_seconds,
        )


@admin.register(CycleRecord)
class CycleRecordAdmin(admin.ModelAdmin):
    list_display = ["id", "started_at", "duration_ms", "policy", "pending", "placed", "preempted", "reserved", "skipped"]  # fmt: skip
    list_filter = ["policy"]
    readonly_fields = [f.name for f in CycleRecord._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(TeamUsage)
class TeamUsageAdmin(admin.ModelAdmin):
    list_display = ["team", "decayed_gpu_seconds", "as_of"]
    readonly_fields = ["team", "decayed_gpu_seconds", "as_of"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
