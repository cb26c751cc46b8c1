"""The job submission form. It only parses what a browser sends; every rule about what a
job may ask for lives in fleet.services.jobs.job_submit, whose field errors the page shows
next to the fields."""

from __future__ import annotations

from typing import Any

from django import forms

from fleet.models.jobs import PRIORITY_MAX, PRIORITY_MIN, Qos
from fleet.services.jobs import ENV_NAME, JobRequest


def parse_env(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not ENV_NAME.match(name.strip()):
            raise forms.ValidationError(
                f"Line {number} is not NAME=value: write one variable per line, e.g. SEED=1."
            )
        env[name.strip()] = value
    return env


class JobForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="A short name to find the job by.")
    command = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        strip=False,
        help_text="The shell command to run, e.g. python train.py --epochs 10.",
    )
    team = forms.ChoiceField(help_text="The team whose quota the job uses.")
    gpus = forms.IntegerField(
        required=False,
        label="GPUs",
        min_value=0,
        max_value=1024,
        help_text="Whole GPUs, on one node unless GPUs per node is set. 0 with the two "
        "fraction fields below asks for a fraction of one GPU. Empty: 1 (or a fraction when "
        "the fraction fields are filled).",
    )
    gpus_per_node = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=1024,
        label="GPUs per node",
        help_text="For a job on several nodes: the GPUs on each node (GPUs must be a multiple "
        "of it). E.g. 6 GPUs with 3 per node run on two nodes. Empty: all GPUs on one node.",
    )
    same_group = forms.BooleanField(
        required=False,
        label="All nodes in one group",
        help_text="Run a multi-node job only on nodes of one topology group (rack, switch); "
        "otherwise one group is preferred.",
    )
    cpus = forms.IntegerField(
        required=False,
        min_value=0,
        label="CPUs per node",
        help_text="Host CPU cores the job needs on each of its nodes. Empty: the team's "
        "default per GPU.",
    )
    memory_mb = forms.IntegerField(
        required=False,
        min_value=0,
        label="Host memory per node (MB)",
        help_text="Host memory the job needs on each of its nodes. Empty: the team's default "
        "per GPU.",
    )
    gpu_memory_mb = forms.IntegerField(
        required=False,
        min_value=1,
        label="GPU memory (MB), fractional jobs",
        help_text="For a fraction of one GPU: the GPU memory the job may use.",
    )
    gpu_compute_percent = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=100,
        label="GPU compute (%), fractional jobs",
        help_text="For a fraction of one GPU: its share of the GPU's compute, 1-100.",
    )
    gpu_model = forms.CharField(
        required=False,
        max_length=100,
        label="GPU model",
        help_text="Run only on this GPU model (e.g. A100-80GB). Empty: any model.",
    )
    min_gpu_memory_mb = forms.IntegerField(
        required=False,
        min_value=1,
        label="Minimum GPU memory (MB)",
        help_text="Run only on GPUs with at least this much memory.",
    )
    time_limit = forms.IntegerField(
        required=False,
        min_value=1,
        label="Time limit (seconds)",
        help_text="The job is stopped after this long. Empty: the team's default.",
    )
    priority = forms.IntegerField(
        initial=0,
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
        help_text=f"From {PRIORITY_MIN} to {PRIORITY_MAX}; higher starts sooner.",
    )
    qos = forms.ChoiceField(
        choices=Qos.choices,
        initial=Qos.NORMAL,
        label="QoS",
        help_text="Quality of service class; high may be limited by team policy.",
    )
    preemptible = forms.BooleanField(
        required=False,
        help_text="The scheduler may stop and requeue the job to make room for others.",
    )
    max_requeues = forms.IntegerField(
        initial=3,
        min_value=0,
        max_value=100,
        label="Maximum requeues",
        help_text="How often the job may go back to the queue (preempted, node lost).",
    )
    env = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        label="Environment",
        help_text="One NAME=value per line.",
    )
    workdir = forms.CharField(
        required=False,
        max_length=1000,
        label="Working directory",
        help_text="Directory on the node to run in. Empty: the agent's default.",
    )

    def __init__(self, *args: Any, teams: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        team_field = self.fields["team"]
        assert isinstance(team_field, forms.ChoiceField)
        team_field.choices = teams

    def clean_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data.get("env") or "")

    def to_request(self) -> JobRequest:
        d = self.cleaned_data
        return JobRequest(
            name=d["name"],
            command=d["command"],
            team=d["team"],
            env=d["env"],
            workdir=d["workdir"],
            gpus=d["gpus"],
            gpu_memory_mb=d["gpu_memory_mb"],
            gpu_compute_percent=d["gpu_compute_percent"],
            gpu_model=d["gpu_model"],
            min_gpu_memory_mb=d["min_gpu_memory_mb"],
            time_limit=d["time_limit"],
            priority=d["priority"],
            qos=d["qos"],
            preemptible=d["preemptible"],
            max_requeues=d["max_requeues"],
            gpus_per_node=d["gpus_per_node"],
            same_group=d["same_group"],
            cpus=d["cpus"],
            memory_mb=d["memory_mb"],
        )


# Which parameter groups each policy reads, beyond the shared ones every cycle reads. The
# groups themselves, the types, ranges and help come from scheduler.cycle.config.
POLICY_GROUPS: dict[str, tuple[str, ...]] = {
    "priority": ("priority",),
    "backfill": ("priority",),
    "las": ("las",),
    "gittins": ("gittins",),
    "gittins-tiers": ("gittins", "priority"),
    "tiresias": ("tiresias",),
    "gavel": ("las", "gavel"),
    "greedy": ("packing",),
    "ilp": ("packing", "ilp"),
    "genetic": ("packing", "genetic"),
    "annealing": ("packing", "annealing"),
}
GROUP_TITLES = {
    "shared": "Every policy: fair share, preemption, QoS, predictions",
    "priority": "Priority weights (priority, backfill)",
    "las": "Least attained service (las)",
    "gittins": "Gittins index (gittins)",
    "tiresias": "Tiresias (tiresias)",
    "gavel": "GPU models by job speed (gavel)",
    "packing": "Job values and packing (greedy, ilp, genetic, annealing)",
    "ilp": "ILP solver",
    "genetic": "Genetic search",
    "annealing": "Simulated annealing",
}
# A parameter named `<prefix>_...` belongs to that policy's group.
PREFIX_GROUPS = (
    "priority", "las", "gittins", "tiresias", "gavel", "ilp", "genetic", "annealing",
)  # fmt: skip


def policy_groups(policy: str) -> tuple[str, ...]:
    """The groups a policy reads: its own entry, else that of the policy it refines
    (`gittins-...` reads the gittins group)."""
    if policy in POLICY_GROUPS:
        return POLICY_GROUPS[policy]
    base = policy.split("-", 1)[0]
    return POLICY_GROUPS.get(base, ())


def param_group(key: str, shared: Any) -> str:
    for prefix in PREFIX_GROUPS:
        if key.startswith(f"{prefix}_"):
            return prefix
    if key in shared:
        return "shared"
    return "packing"


def _parse_param(kind: str, text: str) -> Any:
    """What a browser sent for one parameter, as the API would receive it. Text that does not
    parse is passed on as it is, so the service's check names the expected type."""
    if kind == "bool":
        return {"true": True, "false": False}.get(text, text)
    if kind in ("int", "number"):
        for convert in (int, float):
            try:
                return convert(text)
            except ValueError:
                continue
        return text
    if kind == "numbers":
        items = [part.strip() for part in text.replace(";", ",").split(",") if part.strip()]
        try:
            return [float(part) if "." in part or "e" in part.lower() else int(part)
                    for part in items]  # fmt: skip
        except ValueError:
            return text
    if kind == "ranks":
        ranks: dict[str, Any] = {}
        for part in text.replace(";", ",").split(","):
            if not part.strip():
                continue
            name, sep, rank = part.partition("=")
            if not sep or not name.strip():
                return text
            try:
                ranks[name.strip()] = int(rank.strip())
            except ValueError:
                return text
        return ranks
    return text


def _show_param(kind: str, value: Any) -> str:
    if value is None:
        return ""
    if kind == "bool":
        return "true" if value else "false"
    if kind == "numbers" and isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if kind == "ranks" and isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _show_bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


class SchedulerSettingsForm(forms.Form):
    """One field per scheduler parameter, built from the same definitions the API checks
    against (scheduler.cycle.config.known_params). An empty field means the policy's
    default. Values are checked by config.validate_params, one parameter at a time, so each
    error sits next to its field; saving goes through config.settings_update."""

    policy = forms.ChoiceField(
        label="Active policy", help_text="The ordering and placement policy of the next cycle."
    )
    tick_seconds = forms.CharField(
        label="Tick interval (seconds)",
        help_text="Seconds between periodic cycles; submissions, finishes and node changes "
        "also start one.",
        widget=forms.NumberInput(attrs={"min": 1}),
    )
    # When the page was loaded: a save from a page older than the last change is refused.
    loaded = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, row: Any, **kwargs: Any) -> None:
        from scheduler.cycle import config
        from scheduler.policies import policy_names

        super().__init__(*args, **kwargs)
        known = config.known_params()
        self.initial = {
            "policy": row.policy,
            "tick_seconds": row.tick_seconds,
            "loaded": row.updated_at.isoformat() if row.updated_at else "",
            **{k: _show_param(known[k].kind, v) for k, v in (row.params or {}).items()
               if k in known},
        }  # fmt: skip
        policy_field = self.fields["policy"]
        assert isinstance(policy_field, forms.ChoiceField)
        policy_field.choices = [(name, name) for name in policy_names()]
        tick_widget = self.fields["tick_seconds"].widget
        tick_widget.attrs["max"] = config.MAX_TICK_SECONDS
        self.specs = known
        self.groups: dict[str, list[str]] = {name: [] for name in GROUP_TITLES}
        for key, spec in sorted(self.specs.items()):
            self.groups[param_group(key, config.COMMON)].append(key)
            self.fields[key] = self._param_field(key, spec)

    @staticmethod
    def _param_field(key: str, spec: Any) -> forms.Field:
        default = _show_param(spec.kind, spec.default) or "none"
        bounds = {}
        if spec.minimum is not None:
            bounds["min"] = _show_bound(spec.minimum)
        if spec.maximum is not None:
            bounds["max"] = _show_bound(spec.maximum)
        if bounds:
            shown = f"from {bounds.get('min', '…')} to {bounds.get('max', '…')}"
        else:
            shown = ""
        help_parts = [spec.help.rstrip("."), shown, f"default {default}"]
        help_text = "; ".join(part for part in help_parts if part) + "."
        label = key
        if spec.kind == "bool":
            return forms.ChoiceField(
                label=label,
                required=False,
                choices=[("", f"default ({default})"), ("true", "true"), ("false", "false")],
                help_text=help_text,
            )
        if spec.choices:
            return forms.ChoiceField(
                label=label,
                required=False,
                choices=[("", f"default ({default})"), *((c, c) for c in spec.choices)],
                help_text=help_text,
            )
        if spec.kind in ("int", "number"):
            step = "1" if spec.kind == "int" else "any"
            widget: forms.Widget = forms.NumberInput(
                attrs={**bounds, "step": step, "placeholder": default}
            )
        else:
            example = "e.g. 10, 100, 1000" if spec.kind == "numbers" else "e.g. low=0, high=2"
            widget = forms.TextInput(attrs={"placeholder": example, "spellcheck": "false"})
            help_text = help_text.replace("; default", f" ({example}); default")
        return forms.CharField(label=label, required=False, widget=widget, help_text=help_text)

    def param_groups(self) -> list[tuple[str, str, list[Any], str]]:
        """(group, title, bound fields, policies reading it) in display order."""
        readers = {
            group: " ".join(p for p, groups in POLICY_GROUPS.items() if group in groups)
            for group in GROUP_TITLES
        }
        return [
            (group, GROUP_TITLES[group], [self[key] for key in keys], readers[group])
            for group, keys in self.groups.items()
            if keys
        ]

    def clean(self) -> dict[str, Any]:
        from fleet.errors import ApplicationError
        from scheduler.cycle import config

        data = super().clean() or {}
        params: dict[str, Any] = {}
        for key, spec in self.specs.items():
            text = (self.data.get(key) or "").strip()
            if not text:
                continue
            value = _parse_param(spec.kind, text)
            try:
                config.validate_params({key: value})
            except ApplicationError as error:
                sentence = error.extra["fields"]["params"][0]
                self.add_error(key, f"{sentence[:1].upper()}{sentence[1:]}.")
                continue
            params[key] = value
        data["params"] = params
        tick_text = (self.data.get("tick_seconds") or "").strip()
        try:
            data["tick_seconds"] = config.validate_tick(int(tick_text))
        except (ValueError, ApplicationError):
            self.add_error(
                "tick_seconds",
                f"Give a whole number of seconds from 1 to {config.MAX_TICK_SECONDS}.",
            )
        return data
