"""Django admin. Job state changes go through the state machine, never a form field."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from fleet.errors import ApplicationError
from fleet.models import ApiToken, Gpu, Job, JobEvent, Membership, Node, Team
from fleet.services import jobs as job_services


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "guaranteed_gpus", "gpu_limit", "user_gpu_cap", "priority_weight", "fairshare_weight"]  # fmt: skip
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "team", "role", "is_default"]
    list_filter = ["team", "role"]
    autocomplete_fields = ["user", "team"]


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "state", "state_reason", "last_heartbeat", "gpu_backend", "agent_version"]  # fmt: skip
    list_filter = ["state", "gpu_backend"]
    search_fields = ["name"]
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["node", "index", "model", "memory_mb", "uuid"]
    list_filter = ["model"]
    search_fields = ["uuid", "node__name"]


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["at", "from_state", "to_state", "attempt", "reason", "actor_kind", "actor", "applied"]  # fmt: skip

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _job_action(name: str, verb: str) -> Any:
    def action(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        done, refused = 0, []
        for job in queryset.select_related("team", "node"):
            try:
                getattr(job_services, f"job_{name}")(
                    user=request.user, job=job, reason=f"{verb} in the admin"
                )
                done += 1
            except ApplicationError as exc:
                refused.append(exc.message)
        if done:
            modeladmin.message_user(request, f"{verb.capitalize()}: {done} job(s).")
        for message in refused[:10]:
            modeladmin.message_user(request, message, level=messages.WARNING)

    action.__name__ = f"{name}_jobs"
    return admin.action(description=f"{verb.capitalize()} selected jobs")(action)


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "owner", "team", "state", "gpus", "node", "submitted_at"]
    list_filter = ["state", "team", "qos", "preemptible"]
    search_fields = ["name", "owner__username", "id"]
    readonly_fields = ["state", "state_reason", "attempt", "requeues", "node", "gpu_indices", "pid", "exit_code", "submitted_at", "assigned_at", "started_at", "finished_at", "queue_position", "eta"]  # fmt: skip
    inlines = [JobEventInline]
    actions = [
        _job_action("cancel", "cancelled"),
        _job_action("hold", "held"),
        _job_action("release", "released"),
        _job_action("requeue", "requeued"),
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Jobs are submitted through the API or the dashboard, which validate them.
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "prefix", "created_at", "last_used_at"]
    readonly_fields = ["user", "prefix", "key_hash", "created_at", "last_used_at"]
