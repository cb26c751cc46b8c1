"""Reinforcement-learning hooks over the simulator (optional extra `rl`: gymnasium).

`scheduler.rl.env.SchedulingEnv` is a Gymnasium environment (imports gymnasium);
`scheduler.rl.features` and `scheduler.rl.baseline` are plain numpy and need no extra, so
the trained baseline runs as `python -m scheduler.sim --policy rl-cem` without gymnasium.
"""
