"""The policy advisor: replays the fleet's own recorded jobs through the simulator under every
registered policy and a small grid over their weights, next to what actually happened.

- `records` (pure): a recorded job, the fleet trace rows, the "what happened" metrics.
- `grid` (pure): the candidates (policy + parameter overrides).
- `evaluate` (pure): one simulator run per candidate, non-preemptible jobs honoured.
- `history` (Django, reads): recorded jobs and the cluster from the database, the trace CSV.
- `runs` (Django, writes): advisor runs kept in the cache, their task, and applying a result.

docs/advisor.md says how to use it.
"""
