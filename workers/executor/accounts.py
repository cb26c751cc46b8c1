"""Which local account a job runs as.

An agent running as root starts each job as an unprivileged account: the one mapped from
the job's owner (`user:alice=alice`), else from its team (`team:vision=vision`), else the
default (FLEET_JOB_USER, `fleet-job`), the way Slurm runs a job as the submitting user. A
job that would run as root is refused unless FLEET_ALLOW_ROOT_JOBS=1. An agent that is not
root cannot switch accounts: its jobs run as its own account (a development set-up; the
agent warns at start).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, field

from workers.executor.spec import ExecutorError

DEFAULT_JOB_USER = "fleet-job"


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str

    @classmethod
    def of(cls, entry: pwd.struct_passwd) -> Account:
        try:
            groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        except OSError:
            groups = (entry.pw_gid,)
        return cls(
            name=entry.pw_name,
            uid=entry.pw_uid,
            gid=entry.pw_gid,
            groups=groups,
            home=entry.pw_dir,
            shell=entry.pw_shell,
        )

    def environment(self) -> dict[str, str]:
        """HOME, USER, LOGNAME and SHELL of this account, as login would set them."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "SHELL": self.shell}


def parse_user_map(raw: str) -> tuple[dict[str, str], dict[str, str]]:
    """`team:vision=vision,user:alice=alice` -> ({"alice": "alice"}, {"vision": "vision"}).
    Raises ValueError naming the entry it cannot read."""
    users: dict[str, str] = {}
    teams: dict[str, str] = {}
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        key, sep, account = entry.partition("=")
        kind, colon, name = key.strip().partition(":")
        if not (sep and colon and name.strip() and account.strip()) or kind not in (
            "user",
            "team",
        ):
            raise ValueError(
                f"FLEET_JOB_USER_MAP entry {entry!r} is not user:NAME=ACCOUNT or team:SLUG=ACCOUNT"
            )
        (users if kind == "user" else teams)[name.strip()] = account.strip()
    return users, teams


@dataclass(frozen=True)
class JobAccounts:
    """Maps a job's owner and team to a local account.

    `switch` None means: switch accounts when this process is root (the only case where it
    can). With switching off, jobs run as this process's own account, and `allow_root` is
    still needed if that is root.
    """

    default: str = DEFAULT_JOB_USER
    users: Mapping[str, str] = field(default_factory=dict)
    teams: Mapping[str, str] = field(default_factory=dict)
    allow_root: bool = False
    switch: bool | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> JobAccounts:
        """FLEET_JOB_USER, FLEET_JOB_USER_MAP and FLEET_ALLOW_ROOT_JOBS. Raises ValueError
        on a map it cannot read, so a misconfigured agent does not start."""
        users, teams = parse_user_map(environ.get("FLEET_JOB_USER_MAP", ""))
        return cls(
            default=environ.get("FLEET_JOB_USER", "").strip() or DEFAULT_JOB_USER,
            users=users,
            teams=teams,
            allow_root=environ.get("FLEET_ALLOW_ROOT_JOBS", "").strip() == "1",
        )

    @classmethod
    def own(cls) -> JobAccounts:
        """Jobs run as this process's own account, root included: for tests and
        development set-ups that are not about isolation."""
        return cls(default=pwd.getpwuid(os.geteuid()).pw_name, allow_root=True, switch=False)

    @property
    def switching(self) -> bool:
        return os.geteuid() == 0 if self.switch is None else self.switch

    def account_name(self, *, user: str | None, team: str | None) -> tuple[str, str]:
        """The account for this owner and team, and where the choice came from."""
        if user and user in self.users:
            return self.users[user], f"user:{user} in FLEET_JOB_USER_MAP"
        if team and team in self.teams:
            return self.teams[team], f"team:{team} in FLEET_JOB_USER_MAP"
        return self.default, "FLEET_JOB_USER"

    def resolve(self, *, user: str | None, team: str | None) -> tuple[Account | None, str]:
        """(account to switch to, None to stay this process's own account) and the
        account's name. Raises ExecutorError with a reason a person can act on when the
        account does not exist or is root without allow_root."""
        if not self.switching:
            if os.geteuid() == 0 and not self.allow_root:
                raise ExecutorError(
                    "the agent runs as root and would run the job as root; set "
                    "FLEET_ALLOW_ROOT_JOBS=1 to allow that"
                )
            return None, _own_name()
        name, source = self.account_name(user=user, team=team)
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ExecutorError(
                f"the job's account {name!r} (from {source}) does not exist on this host; "
                f"create it (useradd --system {name}) or map the job to another account"
            ) from None
        if entry.pw_uid == 0 and not self.allow_root:
            raise ExecutorError(
                f"the job would run as root (account {name!r}, from {source}); fleet runs "
                "jobs as root only when the agent is started with FLEET_ALLOW_ROOT_JOBS=1"
            )
        return Account.of(entry), name


def _own_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def own_account() -> Account | None:
    """This process's account, for the HOME etc. of jobs that run as it (None when the uid
    has no passwd entry, as in some containers)."""
    try:
        return Account.of(pwd.getpwuid(os.geteuid()))
    except KeyError:
        return None
