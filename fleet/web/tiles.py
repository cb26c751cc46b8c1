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


def tile_html(tile: Tile, job_prefix: str) -> str:
    classes = ["tile", tile.util_class]
    if tile.jobs:
        classes.append("held")
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
            f'<span class="owner">{escape(job.owner.username)}</span></div>'
        )
    if not tile.jobs:
        parts.append('<div class="t-job idle">idle</div>')
    parts.append("</li>")
    return "".join(parts)


def tiles_html(tiles: list[Tile]) -> SafeString:
    prefix = _job_url_prefix()
    body = "".join(tile_html(t, prefix) for t in tiles)
    return mark_safe(f'<ul class="tiles">{body}</ul>')  # noqa: S308 - escaped above
