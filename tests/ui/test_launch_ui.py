"""The "Launch command" expander with the vLLM and SGLang commands on Explore, Capacity and Find a deployment
(issue 24, item 7): st.code blocks (a copy button each)."""
from __future__ import annotations

from uihelpers import FAST, assert_clean, run_page


def _launch(at):
    exp = [e for e in at.expander if e.label == "Launch command"]
    assert len(exp) == 1
    return [c.value for c in exp[0].code]


def test_explore_shows_its_run_as_commands():
    at = run_page("pages/explore.py", **FAST)
    assert_clean(at)
    vllm, sglang = _launch(at)
    assert vllm.startswith("# vLLM 0.11: Qwen2.5-72B on 8x H100")
    assert "vllm serve Qwen/Qwen2.5-72B-Instruct" in vllm and "--max-num-batched-tokens 32768" in vllm
    assert "python -m sglang.launch_server --model-path Qwen/Qwen2.5-72B-Instruct" in sglang


def test_capacity_shows_one_pair_per_policy():
    at = run_page("pages/capacity.py", **FAST, policies="chunked")
    assert_clean(at)
    codes = _launch(at)
    assert len(codes) == 2 and "--enable-chunked-prefill" in codes[0] and "--chunked-prefill-size 2048" in codes[1]


def test_find_a_deployment_shows_the_chosen_configuration():
    at = run_page("pages/find_a_deployment.py", n="100", s_gpus="h100-sxm", s_precs="bf16", s_tps="8", target="20")
    assert_clean(at)
    buttons = [b for b in at.button if b.label == "Search"]
    if buttons and not [e for e in at.expander if e.label == "Launch command"]:
        buttons[0].click()
        at.run()
        assert_clean(at)
    vllm, sglang = _launch(at)
    assert "--tensor-parallel-size 8" in vllm and "--tp-size 8" in sglang
