from fleet.models.jobs import Job, JobEvent, JobState
from fleet.models.nodes import Gpu, Node, NodeState
from fleet.models.teams import ApiToken, Membership, Role, Team

__all__ = [
    "ApiToken",
    "Gpu",
    "Job",
    "JobEvent",
    "JobState",
    "Membership",
    "Node",
    "NodeState",
    "Role",
    "Team",
]
