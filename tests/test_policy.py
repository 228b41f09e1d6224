import pytest

from batching.sim.policy import PRESETS, BatchingPolicy, preset, with_knobs


def test_presets_are_the_classic_rows():
    assert list(PRESETS) == ["static", "dynamic", "continuous", "chunked", "priority"]
    assert PRESETS["static"].max_batch_size == 32 and PRESETS["static"].mode == "static"
    assert PRESETS["dynamic"].max_batch_size == 64 and PRESETS["dynamic"].mode == "dynamic"
    assert PRESETS["chunked"].chunked_prefill and not PRESETS["continuous"].chunked_prefill
    p = PRESETS["priority"]
    assert p.priority and p.chunked_prefill and p.preemption != "off"
    for pol in PRESETS.values():
        pol.validate()


@pytest.mark.parametrize("knobs, field", [
    (dict(mode="magic"), "mode"), (dict(max_batch_size=0), "max_batch_size"),
    (dict(max_wait_s=-1.0), "max_wait_s"), (dict(max_num_seqs=5000), "max_num_seqs"),
    (dict(max_num_batched_tokens=8), "max_num_batched_tokens"), (dict(preemption="kill"), "preemption"),
])
def test_bad_knobs_name_field_value_and_range(knobs, field):
    with pytest.raises(ValueError, match=field) as e:
        with_knobs(BatchingPolicy(), **knobs)
    assert "allowed" in str(e.value)


def test_chunked_needs_continuous():
    with pytest.raises(ValueError, match="continuous"):
        BatchingPolicy(mode="static", chunked_prefill=True).validate()


def test_batch_cap_follows_mode():
    assert PRESETS["static"].batch_cap == 32
    assert PRESETS["continuous"].batch_cap == 256


def test_unknown_preset():
    with pytest.raises(ValueError, match="allowed: static"):
        preset("nope")
