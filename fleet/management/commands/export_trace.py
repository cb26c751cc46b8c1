"""Write the last N days of recorded jobs as a fleet trace the simulator reads.

python manage.py export_trace --days 7 out.csv     (- writes to standard output)

Standard error says which jobs were left out and gives the simulator command for this
fleet's nodes, e.g.
python -m scheduler.sim --trace out.csv --format fleet --cluster 2x8xA100-80GB \\
    --cpus-per-gpu 0 --memory-gb-per-gpu 0 --policy all
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from fleet.errors import ApplicationError
from scheduler.advisor import history


class Command(BaseCommand):
    help = "Export the last N days of recorded jobs as a fleet trace (CSV)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("out", help="CSV file to write, or - for standard output")
        parser.add_argument(
            "--days", type=int, default=7, help=f"1 to {history.MAX_DAYS} (default 7)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            days = history.check_days(options["days"])
            export = history.recorded_jobs(days=days, now=timezone.now())
            cluster = history.fleet_cluster().spec.text
        except ApplicationError as error:
            raise CommandError(error.message) from None
        text = history.trace_csv(export)
        out = options["out"]
        if out == "-":
            sys.stdout.write(text)
        else:
            Path(out).write_text(text)
        for note in export.notes:
            self.stderr.write(note)
        self.stderr.write(
            f"{len(export.jobs)} jobs from the last {days} days written to {out}. Replay them:\n"
            f"python -m scheduler.sim --trace {out} --format fleet --cluster '{cluster}' "
            "--cpus-per-gpu 0 --memory-gb-per-gpu 0 --policy all"
        )
