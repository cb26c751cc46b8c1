"""GPU tiles as HTML, built in Python: the fleet page draws thousands of them every poll,
and the template engine would spend most of a render resolving their variables.

Every value from the database is escaped; numbers are formatted here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.urls import reverse
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

if TYPE_CHECKING:
    from fleet.web.views.fleet import Tile


def _job_url_prefix() -> str:
    return reverse("job", kwargs={"job_id": 1})[: -len("1/")]


def _short(text: str, limit: int = 18) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def idle_for(seconds: float) -> str:
    """How long, in whole minutes, hours or days: "5 min", "2 h 5 min", "3 d 4 h"."""
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def tile_html(tile: Tile, job_prefix: str) -> str:
    classes = ["tile", tile.util_class]
    if tile.jobs:
        classes.append("held")
    if tile.idle:
        classes.append("job-idle")
    if tile.stale:
        classes.append("stale")
    util = "–" if tile.util is None else f"{tile.util}%"
    parts = [
        f'<li class="{" ".join(classes)}">',
        f'<div class="t-top"><span class="gi">GPU {tile.index}</span> '
        f'<span class="util">{util}</span></div>',
        f'<div class="t-model">{escape(tile.model)}</div>',
    ]
    if tile.mem_percent is not None:
        parts.append(
            f'<div class="membar" role="img" aria-label="memory {tile.mem_used_mb} of '
            f'{tile.memory_mb} MB"><span style="width:{tile.mem_percent}%"></span></div>'
            f'<div class="t-mem">{tile.mem_used_mb}/{tile.memory_mb} MB</div>'
        )
    else:
        parts.append(f'<div class="t-mem">{tile.memory_mb} MB · no reading</div>')
    if tile.temperature is not None:
        extra = f" · {tile.power} W" if tile.power is not None else ""
        stale = " · stale" if tile.stale else ""
        parts.append(f'<div class="t-temp">{tile.temperature}°C{extra}{stale}</div>')
    for job in tile.jobs:
        parts.append(
            f'<div class="t-job"><a href="{job_prefix}{job.pk}/">#{job.pk} '
            f"{escape(_short(job.name))}</a> "
            f'<span class="owner">{escape(job.owner.username)}</span>'
            + (
                f' <span class="badge idle" title="GPUs idle for '
                f'{idle_for(tile.idle[job.pk])}">idle {idle_for(tile.idle[job.pk])}</span>'
                if job.pk in tile.idle
                else ""
            )
            + "</div>"
        )
    if not tile.jobs:
        # "free", not "idle": idle is the badge of a job holding GPUs it does not use.
        parts.append('<div class="t-job free">free</div>')
    parts.append("</li>")
    return "".join(parts)


def tiles_html(tiles: list[Tile]) -> SafeString:
    prefix = _job_url_prefix()
    body = "".join(tile_html(t, prefix) for t in tiles)
    return mark_safe(f'<ul class="tiles">{body}</ul>')  # noqa: S308 - escaped above
