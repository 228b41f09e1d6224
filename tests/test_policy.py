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


@pytest.mark.parametrize("knobs, needle", [
    (dict(spec_decode="medusa"), "spec_decode='medusa' is not allowed; allowed: off, draft, eagle, ngram, mtp"),
    (dict(spec_decode="eagle", spec_tokens=0), "spec_tokens=0 is out of range; allowed 1 to 16"),
    (dict(spec_decode="eagle", spec_tokens=2.5), "spec_tokens=2.5"),
    (dict(spec_decode="eagle", spec_acceptance=1.2), "spec_acceptance=1.2 is out of range; allowed 0 to 1"),
    (dict(spec_decode="eagle", spec_acceptance=float("nan")), "spec_acceptance=nan is out of range"),
    (dict(spec_decode="eagle", spec_disable_batch_size=-1), "spec_disable_batch_size=-1 is out of range"),
    (dict(spec_decode="eagle", spec_disable_batch_size=1),
     "spec_disable_batch_size=1 would never speculate; allowed 0 (never off) or 2 to 4096"),
    (dict(spec_decode="draft", spec_draft_model="gpt-5"), "spec_draft_model='gpt-5' is unknown; allowed: qwen2.5-72b"),
])
def test_bad_speculation_knobs_name_field_value_and_range(knobs, needle):
    with pytest.raises(ValueError) as e:
        with_knobs(PRESETS["continuous"], **knobs)
    assert needle in str(e.value)


def test_speculation_needs_continuous_and_is_described():
    with pytest.raises(ValueError, match="spec_decode='eagle' needs mode='continuous'"):
        BatchingPolicy(mode="static", spec_decode="eagle").validate()
    p = with_knobs(PRESETS["chunked"], spec_decode="draft", spec_tokens=5, spec_acceptance=0.7,
                   spec_disable_batch_size=32)
    assert "speculative decoding (draft qwen2.5-7b, K=5, A=0.7, off at 32+ seqs)" in p.describe()
    assert PRESETS["continuous"].spec_decode == "off" and "speculative" not in PRESETS["continuous"].describe()
