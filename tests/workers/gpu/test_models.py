import pytest

from workers.gpu import GpuSpecError, normalize_model, parse_gpu_spec


def test_spec_expands_counts_in_index_order():
    gpus = parse_gpu_spec("4xA100-80GB,2xV100-32GB")

    assert [g.model for g in gpus] == ["A100-80GB"] * 4 + ["V100-32GB"] * 2
    assert gpus[0].memory_total_mb == 80 * 1024
    assert gpus[5].memory_total_mb == 32 * 1024


def test_known_model_without_size_takes_its_default_and_count_defaults_to_one():
    assert [g.model for g in parse_gpu_spec("2xa100, T4")] == ["A100-80GB", "A100-80GB", "T4-16GB"]


def test_unknown_model_with_explicit_size_is_accepted():
    (gpu,) = parse_gpu_spec("1xMI300-192GB")

    assert (gpu.model, gpu.memory_total_mb) == ("MI300-192GB", 192 * 1024)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty GPU spec"),
        ("4xZZ9", "unknown GPU model 'ZZ9'"),
        ("4xA100-80", "cannot read '4xA100-80'"),
        ("0xA100", "at least 1"),
        ("4xA100,,2xV100", "cannot read ''"),
        ("65xT4", "at most 64"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(GpuSpecError, match=message):
        parse_gpu_spec(spec)


@pytest.mark.parametrize(
    ("name", "memory_mb", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", 40960, "A100-40GB"),
        ("Tesla V100-SXM2-32GB", 32510, "V100-32GB"),
        ("Tesla T4", 15360, "T4-16GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX4090-24GB"),
        ("NVIDIA RTX A6000", 49140, "A6000-48GB"),
    ],
)
def test_driver_names_normalise_to_the_names_simulated_nodes_use(name, memory_mb, model):
    assert normalize_model(name, memory_mb) == model
