"""The commands: each builds its request, calls the API and prints a table or the JSON."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fleetctl.client import Client, CliError, Unreachable, normalize_url, write_config
from fleetctl.units import UsageError, format_duration, parse_size_mb, parse_time

# While following logs: poll quickly while output flows, back off to this when it does not.
FOLLOW_MAX_WAIT_S = 5.0
STATE_CODES = {
    "pending": "PD", "held": "H", "assigned": "CF", "running": "R", "succeeded": "CD",
    "failed": "F", "cancelled": "CA", "timeout": "TO", "lost": "NF",
}  # fmt: skip


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


def _table(rows: list[list[str]], head: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=True)]
        print("  ".join(cells).rstrip())


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _job_body(args: argparse.Namespace, verb: str = "submit") -> dict[str, Any]:
    """The submission's JSON from the options; optional fields are sent only when given, so
    a server that does not know one (gpus_per_node on an older fleet) is not sent it.
    `verb`: the subcommand, named in the sentence for a missing command."""
    words = list(args.command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise UsageError(
            f"Give the command to run after --, e.g. fleetctl {verb} --gpus 1 -- python train.py"
        )
    command = words[0] if len(words) == 1 else shlex.join(words)
    name = args.name or os.path.basename(shlex.split(command)[0] if command.strip() else "job")
    body: dict[str, Any] = {"name": name[:200] or "job", "command": command}
    env: dict[str, str] = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes NAME=VALUE; got {item!r}.")
        env[key] = value
    if env:
        body["env"] = env
    for option, field in (("team", "team"), ("gpus", "gpus"), ("gpus_per_node", "gpus_per_node"),
                          ("nodes", "nodes"), ("same_group", "same_group"), ("cpus", "cpus"), ("gpu_model", "gpu_model"),
                          ("priority", "priority"), ("qos", "qos"), ("preemptible", "preemptible"),
                          ("max_requeues", "max_requeues"), ("workdir", "workdir")):  # fmt: skip
        value = getattr(args, option)
        if value is not None:
            body[field] = value
    for option in ("gpus", "gpus_per_node", "nodes", "cpus"):
        if getattr(args, option) is not None and getattr(args, option) < 0:
            raise UsageError(f"--{option.replace('_', '-')} cannot be negative.")
    if args.mem is not None:
        body["memory_mb"] = parse_size_mb(args.mem, "--mem")
    if args.time is not None:
        body["time_limit"] = parse_time(args.time)
    if args.gpu_share is not None:
        if not 1 <= args.gpu_share <= 100:
            raise UsageError("--gpu-share is a percentage from 1 to 100.")
        if args.gpus not in (None, 0) or args.gpu_mem is None:
            raise UsageError("A fraction of a GPU takes --gpu-share and --gpu-mem, without --gpus.")
        body.update(gpus=0, gpu_compute_percent=args.gpu_share,
                    gpu_memory_mb=parse_size_mb(args.gpu_mem, "--gpu-mem"))  # fmt: skip
    elif args.gpu_mem is not None:
        body["min_gpu_memory_mb"] = parse_size_mb(args.gpu_mem, "--gpu-mem")
    return body


def cmd_login(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get("FLEET_URL")
    if not url:
        raise UsageError("Give fleet's address with --url (or set FLEET_URL).")
    url = normalize_url(url)
    token = args.token or os.environ.get("FLEET_TOKEN")
    if not token:
        token = getpass.getpass("API token: ") if sys.stdin.isatty() else sys.stdin.readline()
        token = token.strip()
    if not token:
        raise UsageError("Give an API token (--token, FLEET_TOKEN or on standard input).")
    me = Client(url=url, token=token).request("GET", "me/")
    path = write_config(url=url, token=token)
    if args.json:
        _print_json({"url": url, "config": str(path), "user": me})
    else:
        print(f"logged in to {url} as {me.get('username')}; saved in {path}")
    return 0


def _ids_text(ids: list[int]) -> str:
    """Job ids as ranges: 101-110,115."""
    parts: list[str] = []
    start = prev = None
    for i in [*ids, None]:
        if i is not None and prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    return ",".join(parts)


def cmd_submit(args: argparse.Namespace) -> int:
    body = _job_body(args)
    if args.array is not None:
        if not args.array.strip():
            raise UsageError("--array takes indices, e.g. 0-99, 0-15:4 or 1,3,5-7.")
        body["array"] = args.array.strip()
    job = Client.from_environment().request("POST", "jobs/", body=body)
    if args.json:
        _print_json(job)
    elif "task_count" in job:
        print(
            f"Submitted job array {job['array_id']}: {job['task_count']} tasks, "
            f"jobs {_ids_text(job['job_ids'])}"
        )
    else:
        print(f"Submitted job {job['id']}")
    return 0


def job_label(job: dict[str, Any]) -> str:
    """ARRAY_INDEX for a task of a job array (like squeue), else the job id."""
    if job.get("array_id") is not None:
        return f"{job['array_id']}_{job['array_index']}"
    return str(job["id"])


def cmd_estimate(args: argparse.Namespace) -> int:
    body = _job_body(args, "estimate")
    est = Client.from_environment().request("POST", "jobs/estimate/", body=body)
    if args.json:
        _print_json(est)
        return 0
    when = "now" if est.get("would_start_now") else (est.get("estimated_start") or "unknown")
    print(f"start: {when}" + (f" on {est['node']}" if est.get("node") else ""))
    print(
        f"reason: {est.get('reason') or '-'} (policy {est.get('policy')}, team {est.get('team')})"
    )
    return 0


def _job_row(job: dict[str, Any], now: datetime) -> list[str]:
    started = _parse_time(job.get("started_at"))
    eta = _parse_time(job.get("eta"))
    if job["state"] == "running" and started:
        when = format_duration((now - started).total_seconds())
    elif eta:
        when = "start in " + format_duration((eta - now).total_seconds())
    else:
        when = "-"
    gpus = job["gpus"] if job["gpus"] else f"{job.get('gpu_compute_percent') or 0}%"
    reason = job.get("node") or job.get("pending_reason") or job.get("state_reason") or ""
    return [
        job_label(job), str(job.get("queue_position") or "-"), job["name"][:24], job["owner"],
        job["team"], STATE_CODES.get(job["state"], job["state"]), str(gpus), when, reason[:80],
    ]  # fmt: skip


def cmd_ls(args: argparse.Namespace) -> int:
    client = Client.from_environment()
    if args.limit < 0:
        raise UsageError("--limit cannot be negative.")
    params: dict[str, Any] = {"team": args.team}
    if args.array is not None:
        # The tasks of one array, by index; ended ones only with --all.
        params.update(array=args.array, ordering="id", page_size=max(1, min(args.limit, 500)))
        if not args.all:
            params["state"] = ["running", "assigned", "pending", "held"]
        if args.mine:
            params["mine"] = "true"
        data = client.request("GET", "jobs/", params=params)
        jobs = sorted(data["results"], key=lambda j: j.get("array_index") or 0)
    elif args.all:
        params.update(ordering="-id", page_size=max(1, min(args.limit, 500)))
        if args.mine:
            params["mine"] = "true"
        data = client.request("GET", "jobs/", params=params)
        jobs = data["results"]
    else:
        params.update(limit=args.limit, mine="true" if args.mine else None)
        data = client.request("GET", "queue/", params=params)
        jobs = data["running"] + data["pending"]
    if args.json:
        _print_json(data)
        return 0
    now = datetime.now(UTC)
    head = ["JOBID", "POS", "NAME", "USER", "TEAM", "ST", "GPUS", "TIME", "NODE/REASON"]
    _table([_job_row(j, now) for j in jobs], head)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    client = Client.from_environment()
    job = client.request("GET", f"jobs/{args.job}/")
    events = client.request("GET", f"jobs/{args.job}/events/") if args.events else None
    if args.json:
        _print_json({**job, "events": events} if events is not None else job)
        return 0
    for key, value in job.items():
        if isinstance(value, dict | list):
            value = json.dumps(value)
        print(f"{key:>20}: {'' if value is None else value}")
    for event in events or []:
        applied = "" if event["applied"] else " (not applied)"
        print(f"  {event['at']}  {event['from_state'] or '-':>9} -> {event['to_state']:<9} "
              f"attempt {event['attempt']}  {event['actor']}: {event['reason']}{applied}")  # fmt: skip
    return 0


def _act(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        client = Client.from_environment()
        failed = 0
        results = []
        whole_arrays = getattr(args, "array", False)
        for job_id in args.jobs:
            try:
                if whole_arrays:
                    found = client.request(
                        "POST", f"arrays/{job_id}/cancel/", body={"reason": args.reason}
                    )
                    results.append(found)
                    if not args.json:
                        print(f"job array {found['id']}: {found['cancelled']} tasks cancelled")
                    continue
                job = client.request(
                    "POST", f"jobs/{job_id}/{action}/", body={"reason": args.reason}
                )
            except Unreachable:
                raise
            except CliError as exc:
                failed = exc.exit_code
                print(f"fleetctl {action}: {exc.message}", file=sys.stderr)
                continue
            results.append(job)
            if not args.json:
                print(f"job {job['id']}: {job['state']}")
        if args.json:
            _print_json(results)
        return failed

    return run


def cmd_logs(args: argparse.Namespace) -> int:
    """Print a job's output; with -f, keep reading until the job has ended and all its
    output is read, through a wait in the queue and across requeues (each new attempt's
    output starts from its beginning)."""
    client = Client.from_environment()
    offset, wait, attempt = 0, 0.5, None
    while True:
        params = {"rank": args.rank, "attempt": args.attempt, "offset": offset}
        chunk = client.request("GET", f"jobs/{args.job}/logs/", params=params)
        if attempt is not None and chunk["attempt"] != attempt:
            attempt, offset = chunk["attempt"], 0
            if not args.json:
                print(f"fleetctl logs: attempt {attempt}", file=sys.stderr, flush=True)
            continue
        attempt = chunk["attempt"]
        if args.json:
            print(json.dumps(chunk), flush=True)
        elif chunk["data"]:
            sys.stdout.write(chunk["data"])
            sys.stdout.flush()
        moved = chunk["next_offset"] != offset
        offset = chunk["next_offset"]
        if chunk.get("complete"):
            if not args.follow or args.attempt is not None:
                return 0
            state = client.request("GET", f"jobs/{args.job}/")["state"]
            if state not in ("pending", "held", "assigned"):
                return 0  # ended for good; a queued job's next attempt is still to come
        elif not args.follow and not moved:
            return 0
        if moved:
            wait = 0.5
            continue
        time.sleep(wait)
        wait = min(wait * 2, FOLLOW_MAX_WAIT_S)


def cmd_nodes(args: argparse.Namespace) -> int:
    nodes = Client.from_environment().request("GET", "nodes/")
    if args.json:
        _print_json(nodes)
        return 0
    rows = []
    for node in nodes:
        gpus = node.get("gpus", [])
        busy = sum(1 for g in gpus if g.get("jobs"))
        models = sorted({g.get("model", "?") for g in gpus})
        rows.append([node["name"], node["state"], f"{busy}/{len(gpus)}", ",".join(models),
                     node.get("state_reason") or ""])  # fmt: skip
    _table(rows, ["NODE", "STATE", "GPUS BUSY", "MODEL", "REASON"])
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    client = Client.from_environment()
    params = {"since": args.since, "until": args.until, "by": args.by, "team": args.team}
    if args.csv:
        sys.stdout.write(client.request("GET", "usage/", params={**params, "format": "csv"},
                                        raw=True))  # fmt: skip
        return 0
    data = client.request("GET", "usage/", params=params)
    if args.json:
        _print_json(data)
        return 0
    # As many decimals as the rows below, so the total reads as their sum.
    print(f"{data['since']} .. {data['until']}: {data['gpu_hours']:.3f} GPU-hours, "
          f"{data.get('cpu_hours', 0):.3f} CPU-hours, "
          f"{data.get('mem_gb_hours', 0):.3f} memory GB-hours")  # fmt: skip

    def host(r: dict[str, Any]) -> list[str]:
        return [f"{r.get('cpu_hours', 0):.3f}", f"{r.get('mem_gb_hours', 0):.3f}"]

    if args.by == "attempt":
        rows = [[str(r["job"]), r["name"][:24], r["user"], r["team"], str(r["attempt"]), r["state"],
                 format_duration(r["seconds"]), str(r["gpus"]), f"{r['gpu_hours']:.3f}",
                 str(r.get("cpus", "")), *host(r)]
                for r in data["rows"]]  # fmt: skip
        head = ["JOBID", "NAME", "USER", "TEAM", "ATTEMPT", "STATE", "ELAPSED", "GPUS", "GPU-H",
                "CPUS", "CPU-H", "MEM-GB-H"]  # fmt: skip
    else:
        rows = [[r["team"], *([r["user"]] if args.by == "user" else []), str(r["jobs"]),
                 str(r["attempts"]), f"{r['gpu_hours']:.3f}", *host(r)]
                for r in data["rows"]]  # fmt: skip
        head = ["TEAM", *(["USER"] if args.by == "user" else []), "JOBS", "ATTEMPTS", "GPU-H",
                "CPU-H", "MEM-GB-H"]  # fmt: skip
    _table(rows, head)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "login": cmd_login,
    "submit": cmd_submit,
    "estimate": cmd_estimate,
    "ls": cmd_ls,
    "show": cmd_show,
    "cancel": _act("cancel"),
    "hold": _act("hold"),
    "release": _act("release"),
    "logs": cmd_logs,
    "nodes": cmd_nodes,
    "usage": cmd_usage,
}


def run(args: argparse.Namespace) -> int:
    if not hasattr(args, "json"):
        args.json = False
    try:
        return COMMANDS[args.action](args)
    except KeyError as exc:
        raise CliError(f"fleet's answer lacked {exc}; is fleetctl older than the server?")
