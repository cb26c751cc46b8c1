from django.urls import include, path
from django.views.generic import RedirectView

from fleet.web.views import (
    charts,
    fleet,
    job,
    node,
    notifications,
    queue,
    scheduler,
    submit,
    token,
    usage,
)

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="fleet"), name="home"),
    path("fleet/", fleet.fleet_page, name="fleet"),
    path("queue/", queue.queue_page, name="queue"),
    path("submit/", submit.submit_page, name="submit"),
    path("jobs/<int:job_id>/", job.job_page, name="job"),
    path("jobs/<int:job_id>/<str:action>/", job.job_action, name="job-action"),
    path("jobs/<int:job_id>/telemetry.json", charts.job_telemetry, name="job-telemetry"),
    path("nodes/<str:name>/", node.node_page, name="node"),
    path("nodes/<str:name>/telemetry.json", charts.node_telemetry, name="node-telemetry"),
    path("nodes/<str:name>/<str:action>/", node.node_action, name="node-action"),
    path("usage/", usage.usage_page, name="usage"),
    path("usage.json", usage.usage_json, name="usage-json"),
    path("scheduler/", scheduler.scheduler_page, name="scheduler"),
    path("advisor/", include("fleet.web.views.advisor")),
    path("scheduler/cycles.json", scheduler.scheduler_cycles_json, name="scheduler-cycles"),
    path("token/", token.token_page, name="token"),
    path("notifications/", notifications.notifications_page, name="notifications"),
]
