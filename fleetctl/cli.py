"""The command line: parse arguments, run one command, map failures to exit codes.

Exit codes: 0 done; 1 the API refused (its sentence on stderr); 2 a usage error (bad
option or value, checked before anything is sent); 3 fleet cannot be reached or did not
accept the token.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fleetctl import commands
from fleetctl.client import CliError
from fleetctl.units import UsageError

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

EPILOG = """\
exit status: 0 done, 1 the API refused (its reason on stderr), 2 usage error,
3 cannot reach fleet or the token was not accepted.

fleet's address and token come from FLEET_URL and FLEET_TOKEN, or from the file
`fleetctl login` writes (~/.config/fleet/config, or FLEET_CONFIG)."""


def _job_options(parser: argparse.ArgumentParser) -> None:
    """What a job asks for: shared by submit and estimate."""
    add = parser.add_argument
    add("--name", "-J", help="job name (default: the command's first word)")
    add("--team", "-A", help="team slug (default: your default team)")
    add("--gpus", "-G", type=int, help="GPUs in all (default 1; 0 with --gpu-share)")
    add("--gpus-per-node", type=int, help="GPUs on each node of a multi-node job")
    add("--nodes", "-N", type=int, help="nodes of a multi-node job")
    add(
        "--same-group",
        action="store_true",
        default=None,
        help="every node of a multi-node job in one topology group",
    )
    add("--cpus", "-c", type=int, help="host CPUs (per node)")
    add("--mem", help="host memory (per node): MiB, or 16G, 512M")
    add(
        "--gpu-mem",
        help="GPU memory: with whole GPUs, only GPUs with at least this much; "
        "with --gpu-share, the slice of one GPU reserved (MiB, or 20G)",
    )
    add("--gpu-share", type=int, metavar="PERCENT", help="a fraction of one GPU: compute share")
    add("--gpu-model", help="GPU model, e.g. A100-80GB")
    add("--time", "-t", help="time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, 2h, 30m")
    add("--priority", type=int, help="-100..100 (default 0)")
    add("--qos", choices=["low", "normal", "high"])
    add("--preemptible", action="store_true", default=None, help="may be preempted and requeued")
    add("--max-requeues", type=int)
    add("--workdir", "-D", help="working directory on the node")
    add("--env", "-e", action="append", default=[], metavar="K=V", help="repeatable")
    add("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )
    parser = argparse.ArgumentParser(
        prog="fleetctl",
        description="Submit and manage jobs on a fleet GPU cluster.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", required=True)

    def command(name: str, help: str, aliases: Sequence[str] = ()) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, aliases=list(aliases), parents=[common])
        p.set_defaults(action=name)
        return p

    p = command("login", "save fleet's address and your token")
    p.add_argument("--url", help="fleet's address (default: FLEET_URL)")
    p.add_argument("--token", help="API token (default: FLEET_TOKEN, else asked for)")

    p = command("submit", "submit a job (sbatch)", ["sbatch"])
    p.add_argument(
        "--array",
        "-a",
        metavar="INDICES",
        help="a job array: one job per index, e.g. 0-99, 0-15:4, 1,3,5-7 (each job sees "
        "FLEET_ARRAY_INDEX)",
    )
    _job_options(p)
    p = command("estimate", "when a job would start, without submitting it")
    _job_options(p)

    p = command("ls", "waiting and running jobs (squeue)", ["squeue"])
    p.add_argument("--mine", "--me", action="store_true", help="only your jobs")
    p.add_argument("--team", "-A", help="only this team's jobs")
    p.add_argument("--all", "-a", action="store_true", help="finished jobs too (newest first)")
    p.add_argument("--limit", type=int, default=100, help="jobs listed (default 100)")
    p.add_argument("--array", type=int, metavar="ID", help="only the tasks of this job array")

    p = command("show", "one job in full (scontrol show job)")
    p.add_argument("job", type=int)
    p.add_argument("--events", action="store_true", help="its state changes too")

    for name, text in (("cancel", "cancel jobs (scancel)"), ("hold", "hold pending jobs"),
                       ("release", "release held jobs")):  # fmt: skip
        p = command(name, text, ["scancel"] if name == "cancel" else [])
        p.add_argument("jobs", type=int, nargs="+", metavar="JOB")
        p.add_argument("--reason", default="")
        if name == "cancel":
            p.add_argument(
                "--array",
                action="store_true",
                help="the numbers are job arrays: cancel every task of each that has not ended",
            )

    p = command("logs", "a job's output")
    p.add_argument("job", type=int)
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    p.add_argument("--rank", type=int, help="member of a multi-node job (default 0)")
    p.add_argument("--attempt", type=int, help="attempt (default: the latest)")

    command("nodes", "nodes and their GPUs (sinfo)", ["sinfo"])

    p = command("usage", "GPU time per team, user or attempt (sacct)", ["sacct"])
    p.add_argument("--since", "-S", help="start (ISO date/time; default 7 days ago)")
    p.add_argument("--until", "-E", help="end (ISO date/time; default now)")
    p.add_argument("--by", choices=["team", "user", "attempt"], default="team")
    p.add_argument("--team", "-A", help="only this team")
    p.add_argument("--csv", action="store_true", help="CSV as the API writes it")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return commands.run(args)
    except UsageError as exc:
        parser.exit(EXIT_USAGE, f"fleetctl {args.action}: {exc}\n")
    except CliError as exc:
        print(f"fleetctl {args.action}: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    return EXIT_OK
