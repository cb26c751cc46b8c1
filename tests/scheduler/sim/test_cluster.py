import pytest

from scheduler.sim.cluster import DEFAULT_MEMORY_MB, parse_cluster


def test_plain_spec_gives_nodes_times_gpus():
    spec = parse_cluster("8x8xV100")
    assert len(spec.nodes) == 8
    assert spec.total_gpus == 64
    assert {n.memory_mb for n in spec.nodes} == {32 * 1024}
    assert len({n.name for n in spec.nodes}) == 8


def test_mix_keeps_each_part_and_memory_from_the_table():
    spec = parse_cluster("4x8xV100+2x4xA100-80GB")
    assert spec.total_gpus == 4 * 8 + 2 * 4
    a100 = [n for n in spec.nodes if n.model == "A100-80GB"]
    assert len(a100) == 2 and all(n.gpus == 4 and n.memory_mb == 80 * 1024 for n in a100)
    assert spec.max_node_gpus == 8
    states = spec.node_states()
    assert all(g.is_whole_free for n in states for g in n.gpus)


def test_unknown_model_gets_default_memory():
    spec = parse_cluster("1x2xMYSTERY9")
    assert spec.nodes[0].memory_mb == DEFAULT_MEMORY_MB


@pytest.mark.parametrize("bad", ["", "8x8", "0x8xV100", "8x0xV100", "8by8xV100", "2x2xV100+"])
def test_bad_specs_are_refused_with_a_message(bad):
    with pytest.raises(ValueError):
        parse_cluster(bad)
