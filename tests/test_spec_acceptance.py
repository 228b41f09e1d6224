"""Issue 39 item 4: speculation's acceptance comes from a published table (method, model family, dataset), is
printed with method and K wherever speculation runs, and a flat default applies only when no row matches, said
as such."""
import json

import pytest

from batching.cli.args import build_scenario, spec_json, spec_line
from batching.cli.main import main, make_parser
from batching.sim.engine import spec_table as t
from batching.sim.engine.speculative import acceptance_from_length, expected_tokens_per_step
from batching.sim.hardware.specs import MODELS
from batching.sim.policy import BatchingPolicy, with_knobs


def test_every_row_is_a_published_measurement_of_a_preset_family():
    families = {t.family(m) for m in MODELS.values()}
    assert len(t.rows()) >= 2
    for r in t.rows():
        assert r.family in families, r
        assert r.source.strip() and r.dataset.strip() and r.measured_on.strip()
        assert (r.acceptance_length is None) != (r.acceptance_rate is None), r  # exactly one, as published
        if r.acceptance_length is not None:
            assert 1.0 <= r.acceptance_length <= r.k + 1
        assert 0.0 < r.a < 1.0


def test_families_of_the_presets():
    assert t.family(MODELS["llama-3.1-70b"]) == "llama-3.1"
    assert t.family(MODELS["qwen3-30b-a3b"]) == "qwen3"
    assert t.family(MODELS["mixtral-8x7b"]) == "mixtral"
    assert t.family(MODELS["deepseek-v3"]) == "deepseek-v3"


def test_eagle_on_llama_uses_vllm_s_measured_eagle3_acceptance_not_the_flat_default():
    found = t.default_acceptance("eagle", MODELS["llama-3.1-70b"], 3, "chat")
    assert found.row is not None and "#26191" in found.row.source
    assert found.a == pytest.approx(acceptance_from_length(3.53, 7))
    assert found.a != pytest.approx(0.8, abs=0.02)
    # at K = 3 that is 2.71 tokens per verification (EAGLE-3 paper Table 3's chain, spec_check.EAGLE3_L3)
    assert expected_tokens_per_step(3, found.a) == pytest.approx(2.71, abs=0.01)
    assert "MT-bench" in found.note and "stands for no workload" not in found.note


def test_a_workload_the_dataset_does_not_stand_for_is_said():
    found = t.default_acceptance("eagle", MODELS["llama-3.1-8b"], 3, "code")
    assert found.row is not None
    assert "stands for no workload of its own here" in found.note and "'code'" in found.note


def test_mtp_on_deepseek_uses_the_technical_report_s_second_token_acceptance():
    found = t.default_acceptance("mtp", MODELS["deepseek-v3"], 1, "chat")
    assert found.a == 0.85 and "2412.19437" in found.note and "85-90 %" in found.note


def test_no_row_falls_back_to_the_flat_default_and_says_why():
    found = t.default_acceptance("ngram", MODELS["qwen2.5-72b"], 3, "chat")
    assert found.row is None and found.a == BatchingPolicy.spec_acceptance == 0.8
    assert "no published row for n-gram on Qwen2.5-72B (family qwen2.5)" in found.note
    assert "flat default" in found.note and "--spec-acceptance" in found.note


def _policy(argv):
    return build_scenario(make_parser().parse_args(["run", *argv])).policy


def test_the_cli_looks_the_acceptance_up_when_none_is_given():
    pol = _policy(["--model", "llama-3.1-70b", "--workload", "chat", "--spec-decode", "eagle"])
    assert pol.spec_acceptance == pytest.approx(acceptance_from_length(3.53, 7))
    assert pol.spec_acceptance_source.startswith("published:")
    line = spec_line(pol)
    assert line.startswith("# speculation: EAGLE, K = 3, A = 0.743 (2.71 tokens per verification); acceptance "
                           "published: Llama-3.1-8B-Instruct")
    d = spec_json(pol)["speculation"]
    a = acceptance_from_length(3.53, 7)
    assert (d["method"], d["k"], d["acceptance"]) == ("eagle", 3, pytest.approx(a, abs=1e-4))
    assert "#26191" in d["acceptance_source"]


@pytest.mark.parametrize("flags, source", [
    (["--spec-acceptance", "0.6"], "given: A = 0.6"),
    (["--spec-acceptance-length", "2"], "given: acceptance length 2 at K = 3"),
])
def test_a_given_acceptance_is_used_and_said_given(flags, source):
    pol = _policy(["--model", "llama-3.1-70b", "--spec-decode", "eagle", *flags])
    assert pol.spec_acceptance_source == ""
    assert spec_json(pol)["speculation"]["acceptance_source"] == source
    assert spec_line(pol).endswith(f"acceptance {source}")


def test_changing_the_method_or_acceptance_drops_a_looked_up_source():
    pol = t.with_default_acceptance(BatchingPolicy(spec_decode="eagle"), MODELS["llama-3.1-8b"], "chat")
    assert pol.spec_acceptance_source
    assert with_knobs(pol, spec_acceptance=0.5).spec_acceptance_source == ""
    assert with_knobs(pol, spec_decode="ngram").spec_acceptance_source == ""
    assert with_knobs(pol, spec_tokens=5).spec_acceptance_source == pol.spec_acceptance_source  # A holds at any K


def test_no_speculation_no_line_and_no_json():
    pol = _policy(["--model", "llama-3.1-8b"])
    assert spec_line(pol) is None and spec_json(pol) == {}


def test_run_prints_and_writes_method_k_and_acceptance(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["run", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--workload", "chat",
                 "--requests", "40", "--rate", "1", "--spec-decode", "eagle", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "# speculation: EAGLE, K = 3, A = 0.743" in text and "vllm-project/vllm issue #26191" in text
    spec = json.loads(out.read_text())["speculation"]
    assert spec["method"] == "eagle" and spec["k"] == 3 and spec["acceptance_source"].startswith("published:")


def test_capacity_prints_and_writes_method_k_and_acceptance(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["capacity", "--model", "deepseek-v3", "--gpu", "h200-sxm", "--precision", "fp8", "--workload", "chat",
                 "--requests", "40", "--slo-tpot-ms", "100", "--spec-decode", "mtp", "--spec-tokens", "1",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "# speculation: MTP, K = 1, A = 0.85 (1.85 tokens per verification); acceptance published: DeepSeek-V3" \
        in text
    spec = json.loads(out.read_text())["speculation"]
    assert (spec["method"], spec["k"], spec["acceptance"]) == ("mtp", 1, 0.85)
    assert "2412.19437" in spec["acceptance_source"]


def test_exports_name_the_speculation_in_the_scenario_rows():
    from batching.report import scenario_rows

    sc = build_scenario(make_parser().parse_args(["run", "--model", "deepseek-v3", "--gpu", "h200-sxm",
                                                  "--precision", "fp8", "--spec-decode", "mtp", "--spec-tokens", "1"]))
    rows = dict(scenario_rows(sc))
    assert rows["Speculation"].startswith("MTP, K = 1, A = 0.85") and "2412.19437" in rows["Speculation"]
    assert "Speculation" not in dict(scenario_rows(sc.with_policy(with_knobs(sc.policy, spec_decode="off"))))
