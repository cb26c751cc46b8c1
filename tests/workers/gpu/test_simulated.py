import pytest

from workers.gpu import SimulatedGpuBackend, select_backend


def _backend(seed=7, node="sim-01"):
    return SimulatedGpuBackend(
        "2xA100-80GB,1xRTX4090", node_name=node, seed=seed, clock=lambda: 50.0
    )


def test_inventory_is_clearly_simulated_and_deterministic_per_node():
    backend = _backend()

    gpus = backend.inventory()

    assert backend.backend_name == "simulated"
    assert [g.uuid for g in gpus] == ["SIM-sim-01-0", "SIM-sim-01-1", "SIM-sim-01-2"]
    assert all(g.name.startswith("Simulated ") for g in gpus)
    assert [g.model for g in gpus] == ["A100-80GB", "A100-80GB", "RTX4090-24GB"]
    assert _backend(seed=99).inventory() == gpus


def test_same_seed_gives_same_readings_and_another_seed_differs():
    runs = []
    for seed in (7, 7, 8):
        backend = _backend(seed=seed)
        backend.register_job_process(1001, [0, 1], env={})
        runs.append([backend.sample() for _ in range(3)])

    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_readings_follow_the_registered_job():
    backend = _backend()
    backend.register_job_process(
        1001, [0], env={"FLEET_SIM_UTIL": "60", "FLEET_SIM_MEMORY_MB": "30000"}
    )

    busy, idle, _ = backend.sample()

    assert busy.util_percent == pytest.approx(60, abs=8)
    assert busy.memory_used_mb == 30000
    assert [tuple(p) for p in busy.processes] == [(1001, 30000)]
    assert busy.power_w > idle.power_w
    assert (idle.util_percent, idle.memory_used_mb, idle.processes) == (0.0, 0, ())
    assert idle.throttle_reasons == ("gpu_idle",)

    backend.unregister_job_process(1001)

    assert backend.sample()[0].processes == ()


def test_default_load_is_85_percent_and_a_fifth_of_memory_or_the_fraction():
    backend = _backend()
    backend.register_job_process(1, [0], env={})
    backend.register_job_process(2, [1], env={}, gpu_memory_mb=8000, gpu_compute_percent=25)

    whole, fraction, _ = backend.sample()

    assert whole.util_percent == pytest.approx(85, abs=8)
    assert whole.memory_used_mb == 81920 // 5
    assert fraction.util_percent == pytest.approx(25, abs=8)
    assert fraction.memory_used_mb == 8000


def test_fans_and_ecc_depend_on_the_board():
    a100, _, rtx = _backend().sample()

    assert a100.fan_percent is None and a100.ecc_errors == 0
    assert rtx.fan_percent is not None and rtx.ecc_errors is None


@pytest.mark.parametrize(
    ("env", "indices", "message"),
    [
        ({"FLEET_SIM_UTIL": "lots"}, [0], "FLEET_SIM_UTIL='lots' is not a number"),
        ({"FLEET_SIM_MEMORY_MB": "-5"}, [0], "must not be negative"),
        ({}, [3], "GPU 3 does not exist on simulated node sim-01"),
    ],
)
def test_bad_declarations_are_refused(env, indices, message):
    with pytest.raises(ValueError, match=message):
        _backend().register_job_process(1, indices, env=env)


def test_select_backend_simulates_only_when_asked():
    from_arg = select_backend("1xT4", "n1", environ={})
    from_env = select_backend(None, "n2", environ={"FLEET_SIMULATE_GPUS": "2xV100"})

    assert from_arg.backend_name == from_env.backend_name == "simulated"
    assert [g.uuid for g in from_env.inventory()] == ["SIM-n2-0", "SIM-n2-1"]
