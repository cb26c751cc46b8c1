"""The node page: its GPUs live, telemetry charts over a chosen range, the jobs it ran,
and drain/resume for staff."""

from __future__ import annotations

import time

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from fleet.errors import ApplicationError, NotFound
from fleet.models import Node, NodeState
from fleet.selectors.jobs import job_list
from fleet.selectors.nodes import node_get
from fleet.selectors.telemetry import telemetry_refused
from fleet.services.nodes import node_drain, node_resume
from fleet.web import live
from fleet.web.access import member_required, staff_required
from fleet.web.views.charts import DEFAULT_RANGE, RANGES
from fleet.web.views.fleet import build_rows

JOBS_PER_PAGE = 25


def _get(name: str) -> Node:
    try:
        return node_get(name=name)
    except NotFound as error:
        raise Http404(error.message)


@member_required
def node_page(request: HttpRequest, name: str) -> HttpResponse:
    node = _get(name)
    rows, has_telemetry = build_rows([node], time.time())
    context = {"row": rows[0], "node": node, "has_telemetry": has_telemetry}
    if live.is_partial(request):
        return render(request, "partials/node_live.html", context)
    # Jobs that ran here and still name this node (a requeued job forgets its old node).
    ran_here = job_list(fetched_by=request.user).filter(node=node).order_by("-id")
    jobs = Paginator(ran_here, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    chosen = request.GET.get("range", DEFAULT_RANGE)
    context.update(
        {
            "jobs": jobs,
            "page": jobs,
            "ranges": list(RANGES),
            "range": chosen if chosen in RANGES else DEFAULT_RANGE,
            "can_drain": request.user.is_staff,
        }
    )
    if request.user.is_staff:  # readings refused on arrival: staff act on a broken host
        refused = telemetry_refused(node=node)
        context["refused_total"] = refused.pop("total", 0)
        context["refused_fields"] = ", ".join(f"{k}: {v}" for k, v in sorted(refused.items()))
    return render(request, "web/node.html", context)


@require_POST
@staff_required
def node_action(request: HttpRequest, name: str, action: str) -> HttpResponse:
    node = _get(name)
    try:
        if action == "drain":
            node_drain(node=node, user=request.user, reason=request.POST.get("reason", "")[:500])
        elif action == "resume":
            node_resume(node=node, user=request.user)
        else:
            raise Http404("No such action.")
    except ApplicationError as error:
        messages.error(request, error.message)
    else:
        state = "draining" if action == "drain" else NodeState.UP.value
        messages.success(request, f"Node {node.name} is {state}.")
    return redirect("node", name=node.name)
