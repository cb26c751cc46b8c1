"""A self-contained HTML report of one or more runs: metrics table, JCT CDF per policy,
GPU utilization and queue length over time. plotly.js is embedded, so it opens offline."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.sim.engine import SimResult
from scheduler.sim.metrics import FINISHED

MAX_POINTS = 2000
TABLE_KEYS = (
    ("jct_avg", "avg JCT (s)"),
    ("jct_p95", "p95 JCT (s)"),
    ("queue_avg", "avg wait (s)"),
    ("makespan", "makespan (s)"),
    ("utilization", "GPU util"),
    ("preemptions", "preemptions"),
    ("jain_slowdown", "Jain (slowdown)"),
    ("ftf_rho_avg", "FTF rho avg"),
    ("jct_vs_bound", "JCT / bound"),
)


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values = np.sort(values)
    ys = np.arange(1, values.size + 1) / max(values.size, 1)
    if values.size > MAX_POINTS:
        idx = np.linspace(0, values.size - 1, MAX_POINTS).astype(int)
        values, ys = values[idx], ys[idx]
    return values, ys


def _series(result: SimResult) -> tuple[list[float], list[float], list[float]]:
    """(time in hours, busy fraction, queue length), thinned to MAX_POINTS samples."""
    tl = result.state.timeline
    if len(tl) > MAX_POINTS:
        step = len(tl) / MAX_POINTS
        tl = [tl[int(i * step)] for i in range(MAX_POINTS)] + [tl[-1]]
    total = result.state.total_gpus or 1
    return (
        [t / 3600 for t, *_ in tl],
        [busy / total for _, busy, _, _ in tl],
        [float(q) for _, _, q, _ in tl],
    )


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    return html.escape(str(value))


def render_html(
    results: dict[str, SimResult], metrics: dict[str, dict[str, Any]], title: str
) -> str:
    import plotly.graph_objects as go

    figs = []
    cdf = go.Figure()
    util = go.Figure()
    queue = go.Figure()
    for name, result in results.items():
        runs = [r for r in result.state.jobs.values() if r.state in FINISHED]
        jct = np.array(
            [r.finish - r.spec.submit for r in runs if r.finish is not None], dtype=float
        )
        xs, ys = _cdf(jct)
        cdf.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name))
        t, busy, q = _series(result)
        util.add_trace(go.Scatter(x=t, y=busy, mode="lines", name=name, line_shape="hv"))
        queue.add_trace(go.Scatter(x=t, y=q, mode="lines", name=name, line_shape="hv"))
    cdf.update_layout(title="JCT CDF", xaxis_title="JCT (s)", yaxis_title="fraction of jobs")
    cdf.update_xaxes(type="log")
    util.update_layout(title="GPU utilization", xaxis_title="hours", yaxis_title="busy fraction")
    queue.update_layout(title="Queue length", xaxis_title="hours", yaxis_title="jobs waiting")
    figs = [cdf, util, queue]
    parts = [
        fig.to_html(full_html=False, include_plotlyjs=(i == 0), default_height=420)
        for i, fig in enumerate(figs)
    ]
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in TABLE_KEYS)
    rows = []
    for name, m in metrics.items():
        if "error" in m:
            rows.append(
                f"<tr><td>{html.escape(name)}</td><td colspan=9>{_fmt(m['error'])}</td></tr>"
            )
            continue
        cells = "".join(f"<td>{_fmt(m.get(key))}</td>" for key, _ in TABLE_KEYS)
        rows.append(f"<tr><td>{html.escape(name)}</td>{cells}</tr>")
    table = f"<table><tr><th>policy</th>{head}</tr>{''.join(rows)}</table>"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
        "</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{table}{''.join(parts)}</body></html>"
    )


def write_html(
    path: str | Path, results: dict[str, SimResult], metrics: dict[str, dict[str, Any]], title: str
) -> None:
    Path(path).write_text(render_html(results, metrics, title), encoding="utf-8")
