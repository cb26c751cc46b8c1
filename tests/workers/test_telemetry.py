import json

from workers.gpu import SimulatedGpuBackend
from workers.telemetry import job_gpu_usage, telemetry_payload


def test_payload_tags_processes_with_jobs_and_sums_usage_per_job():
    backend = SimulatedGpuBackend("2xV100-32GB", node_name="n1", seed=3, clock=lambda: 77.0)
    backend.register_job_process(500, [0, 1], env={"FLEET_SIM_MEMORY_MB": "10000"})
    backend.register_job_process(600, [1], env={"FLEET_SIM_MEMORY_MB": "2000"})
    samples = backend.sample()

    payload = json.loads(
        json.dumps(
            telemetry_payload(
                node_name="n1",
                backend_name=backend.backend_name,
                samples=samples,
                job_by_pid={500: 11},
            )
        )
    )

    assert payload["backend"] == "simulated" and payload["sampled_at"] == 77.0
    assert payload["gpus"][1]["processes"] == [
        {"pid": 500, "used_memory_mb": 10000, "job_id": 11},
        {"pid": 600, "used_memory_mb": 2000, "job_id": None},
    ]
    assert payload["jobs"] == {"11": {"memory_mb": 20000, "gpu_indices": [0, 1]}}
    assert job_gpu_usage(samples, {}) == {}
