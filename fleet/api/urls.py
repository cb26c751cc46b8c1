from django.contrib.auth.decorators import login_required
from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from fleet.api import arrays, jobs, logs, me, nodes, notifications, teams, telemetry, usage
from scheduler.api import estimate, queue
from scheduler.api import settings as scheduler_settings

urlpatterns = [
    path("jobs/", jobs.JobListApi.as_view(), name="job-list"),
    path("jobs/estimate/", estimate.JobEstimateApi.as_view(), name="job-estimate"),
    path("jobs/bulk/", arrays.JobBulkApi.as_view(), name="job-bulk"),
    path("arrays/<int:array_id>/", arrays.ArrayDetailApi.as_view(), name="array-detail"),
    path("arrays/<int:array_id>/cancel/", arrays.ArrayCancelApi.as_view(), name="array-cancel"),
    path("jobs/<int:job_id>/", jobs.JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/cancel/", jobs.JobCancelApi.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/hold/", jobs.JobHoldApi.as_view(), name="job-hold"),
    path("jobs/<int:job_id>/release/", jobs.JobReleaseApi.as_view(), name="job-release"),
    path("jobs/<int:job_id>/requeue/", jobs.JobRequeueApi.as_view(), name="job-requeue"),
    path("jobs/<int:job_id>/events/", jobs.JobEventsApi.as_view(), name="job-events"),
    path("jobs/<int:job_id>/logs/", logs.JobLogsApi.as_view(), name="job-logs"),
    path("nodes/", nodes.NodeListApi.as_view(), name="node-list"),
    path("nodes/<str:name>/", nodes.NodeDetailApi.as_view(), name="node-detail"),
    path("nodes/<str:name>/drain/", nodes.NodeDrainApi.as_view(), name="node-drain"),
    path("nodes/<str:name>/resume/", nodes.NodeResumeApi.as_view(), name="node-resume"),
    path(
        "nodes/<str:name>/telemetry/", telemetry.NodeTelemetryApi.as_view(), name="node-telemetry"
    ),
    path("teams/", teams.TeamListApi.as_view(), name="team-list"),
    path("teams/<slug:slug>/", teams.TeamDetailApi.as_view(), name="team-detail"),
    path("queue/", queue.QueueApi.as_view(), name="queue"),
    path("scheduler/", scheduler_settings.SchedulerSettingsApi.as_view(), name="scheduler"),
    path("usage/", usage.UsageApi.as_view(), name="usage"),
    path("me/", me.MeApi.as_view(), name="me"),
    path(
        "me/notifications/",
        notifications.NotificationSettingsApi.as_view(),
        name="me-notifications",
    ),
    path("tokens/", me.TokenApi.as_view(), name="tokens"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # A browser page: an anonymous visitor is sent to the login page first.
    path("docs/", login_required(SpectacularSwaggerView.as_view(url_name="schema")), name="docs"),
]
