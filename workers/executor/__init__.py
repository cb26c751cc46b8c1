"""Job execution on a GPU host: start attempts, supervise them, read their logs.

Pure code (no Django, no Celery); the agent's Celery tasks call it. Typical use::

    executor = Executor("/var/lib/fleet/agent", gpu_backend=backend)
    supervisor = Supervisor(executor, report=send_job_report)
    threading.Thread(target=supervisor.run_forever, args=(1.0,), daemon=True).start()
    pid = supervisor.start(JobSpec(job_id=7, attempt=1, command="python train.py",
                                   log_path="/var/log/fleet/7.1.log", gpu_indices=(0, 1),
                                   time_limit=3600, grace=30))
    supervisor.preempt(7, 1)
"""

from workers.executor.attempts import LOST
from workers.executor.attribution import pid_to_job
from workers.executor.launcher import Executor
from workers.executor.logs import read_log
from workers.executor.spec import ExecutorError, JobKey, JobSpec, LeaseExpired, job_environment
from workers.executor.supervisor import Supervisor

__all__ = [
    "LOST",
    "Executor",
    "ExecutorError",
    "LeaseExpired",
    "JobKey",
    "JobSpec",
    "Supervisor",
    "job_environment",
    "pid_to_job",
    "read_log",
]
