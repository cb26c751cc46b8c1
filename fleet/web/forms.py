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
