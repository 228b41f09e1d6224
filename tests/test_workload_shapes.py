"""Issue 39 item 5: `--prompt-tokens N --output-tokens M` alone makes one class of exactly those lengths (it kept
`mixed`'s two classes, so "batch analysis" could bind a plan of one request shape); beside a --workload, or alone,
a length replaces that length in each of the preset's classes; and a reasoning (long output) and a long-context
(long prompt) preset exist, sized from published and shipped figures."""
from __future__ import annotations

import numpy as np
import pytest

from batching.cli.args import FIXED_CLASS, workload_from_args
from batching.cli.main import make_parser
from batching.sim.hardware.specs import MODELS
from batching.sim.workload.requests import WORKLOAD_PRESETS, workload_preset


def _workload(*flags: str):
    args = make_parser().parse_args(["run", "--requests", "200", *flags])
    return workload_from_args(args)


def test_both_lengths_without_a_workload_make_one_class_of_those_lengths():
    wl = _workload("--prompt-tokens", "1000", "--output-tokens", "8000")
    assert [c.name for c in wl.classes] == [FIXED_CLASS] and wl.classes[0].share == 1.0
    reqs = wl.generate()
    assert set(reqs.prompt_tokens) == {1000} and set(reqs.output_tokens) == {8000}
    assert reqs.class_names == (FIXED_CLASS,) and set(reqs.priority) == {0}


def test_a_length_beside_a_workload_or_alone_keeps_the_presets_classes():
    mixed = _workload("--workload", "mixed", "--prompt-tokens", "1000", "--output-tokens", "8000")
    assert [c.name for c in mixed.classes] == ["interactive chat", "batch analysis"]
    assert set(mixed.generate().output_tokens) == {8000}
    alone = _workload("--output-tokens", "300")
    assert [c.name for c in alone.classes] == ["interactive chat", "batch analysis"]
    reqs = alone.generate()
    assert set(reqs.output_tokens) == {300} and len(set(reqs.prompt_tokens)) > 10  # the preset's prompts
    assert [c.name for c in _workload().classes] == ["interactive chat", "batch analysis"]  # the default: mixed


def test_reasoning_and_long_context_presets():
    assert {"reasoning", "long-context"} <= set(WORKLOAD_PRESETS)
    assert _workload("--workload", "reasoning").classes == WORKLOAD_PRESETS["reasoning"]
    context = MODELS["qwen2.5-72b"].max_context_tokens  # 32,768: the default model's
    r = workload_preset("reasoning", 1.0, 20_000, 0).generate()
    # DeepSeek-R1's 4,717.5 tokens per answer (arXiv 2501.18576), less the few cut at 16,384
    assert 4_300 < r.output_tokens.mean() < 4_800 and r.output_tokens.max() <= 16_384
    assert 900 < r.prompt_tokens.mean() < 1_100 and r.output_tokens.mean() > 4 * r.prompt_tokens.mean()
    lc = workload_preset("long-context", 1.0, 20_000, 0).generate()
    assert 18_500 < lc.prompt_tokens.mean() < 20_500 and 400 < lc.output_tokens.mean() < 600
    assert lc.prompt_tokens.mean() > 30 * lc.output_tokens.mean()
    for reqs in (r, lc):  # every request fits a 32k context: none is rejected on the default model
        assert int(np.max(reqs.prompt_tokens + reqs.output_tokens)) <= context


@pytest.mark.parametrize("name", ["reasoning", "long-context"])
def test_the_new_presets_run(name):
    from batching.sim.simulate import Scenario, simulate

    s = simulate(Scenario(workload=workload_preset(name, 0.5, 12, 0))).summary()
    assert s["num_requests"] == 12 and s["throughput_output_tok_s"] > 0
