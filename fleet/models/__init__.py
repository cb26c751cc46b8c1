from fleet.models.jobs import Job, JobEvent, JobMember, JobState, MemberState
from fleet.models.nodes import Gpu, GpuRelease, Node, NodeState
from fleet.models.notifications import (
    JobIdle,
    Notification,
    NotificationEvent,
    NotificationSettings,
)
from fleet.models.teams import ApiToken, Membership, Role, Team
from fleet.models.telemetry import JobLogChunk, TelemetryRollup, TelemetrySample

__all__ = [
    "ApiToken",
    "Gpu",
    "GpuRelease",
    "Job",
    "JobEvent",
    "JobIdle",
    "JobLogChunk",
    "JobMember",
    "JobState",
    "MemberState",
    "Membership",
    "Node",
    "NodeState",
    "Notification",
    "NotificationEvent",
    "NotificationSettings",
    "Role",
    "Team",
    "TelemetryRollup",
    "TelemetrySample",
]
