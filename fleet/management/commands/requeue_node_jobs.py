"""Requeue the jobs the named nodes run, as when those nodes are lost.

python manage.py requeue_node_jobs sim-1 sim-2 [--reason "..."]

Every job assigned to or running on one of the nodes (any member of a multi-node job) is
requeued, or failed once it has used up its requeues, with the reason given, exactly as
the reaper does for a node that stopped answering. `make up` runs it once it has stopped
the jobs of the agents it started, so those jobs do not show as running while nothing
runs them. Each job is one transaction, fenced by its attempt: a report the node sends
later about that attempt changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.db.models import F, Q

from fleet.errors import ApplicationError
from fleet.models import Job, JobState, Node
from fleet.services.job_reports import requeue_lost


class Command(BaseCommand):
    help = "Requeue (or fail, once out of requeues) the jobs the named nodes run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("nodes", nargs="+", help="Node names.")
        parser.add_argument("--reason", default="its node was stopped", help="Why, for the job.")

    def handle(self, *args: Any, **options: Any) -> None:
        nodes = dict(Node.objects.filter(name__in=options["nodes"]).values_list("id", "name"))
        on_them = Q(node_id__in=nodes) | Q(
            members__node_id__in=nodes, members__attempt=F("attempt")
        )
        active = (JobState.ASSIGNED, JobState.RUNNING)
        ids = Job.objects.filter(on_them, state__in=active).values_list("id", flat=True)
        done = []
        for job_id in sorted(set(ids)):
            try:
                with transaction.atomic():
                    job = Job.objects.select_for_update().get(pk=job_id)
                    if job.state not in active:
                        continue
                    gone = job.node_id if job.node_id in nodes else None
                    requeue_lost(job, options["reason"], node_id=gone)
            except ApplicationError as e:  # it moved on meanwhile: nothing to do
                self.stderr.write(f"job {job_id}: {e}")
                continue
            done.append(job_id)
        if done:
            self.stdout.write(
                f"requeued or failed {len(done)} job(s) that ran on {', '.join(nodes.values())}: "
                f"{', '.join(map(str, done))}"
            )
