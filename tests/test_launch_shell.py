"""Launch commands that run as printed (issue 39, items 6 and 7): a hostile model name stays one word when the set is
pasted into bash, a comment stays one line, and a prefill/decode split on one node starts every instance on its own
GPUs and ports with the proxy or router pointing at them. Each set runs in bash with fake
engines on PATH (tests/launchrun.py)."""
import pytest

from batching.sim.hardware.specs import GPUS, MODELS, Deployment, Node, model_from_dict
from batching.sim.policy import PRESETS
from batching.sim.simulate import Scenario
from batching.sim.topology.disagg import Disagg
from batching.studies.launch import launch
from launchrun import no_leftovers, options, program, run_set

HOSTILE = ["x;touch PWNED #", "$(touch PWNED)", "`touch PWNED`", "a' ; touch PWNED ; '", "x && touch PWNED"]
LLAMA = {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
         "ffn_size": 14336, "vocab_size": 128256}
HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
      "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
      "max_position_embeddings": 8192}


def _scenarios(model):
    dep = Deployment(Node(GPUS["h100-sxm"], 8, 2), model)
    yield Scenario(dep, policy=PRESETS["chunked"])
    yield Scenario(dep, policy=PRESETS["priority"], engine="trtllm")
    yield Scenario(dep, policy=PRESETS["chunked"], disagg=Disagg(2, 2, 1, 4))


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_model_name_stays_one_word(tmp_path, name):
    model = model_from_dict(dict(LLAMA, name=name))
    for sc in _scenarios(model):
        for engine, text in launch(sc).items():
            procs = run_set(text, tmp_path)
            assert not (tmp_path / "PWNED").exists(), (engine, text)
            assert no_leftovers(tmp_path) == []
            servers = [p for p in procs if program(p) in ("vllm", "sglang", "trtllm")]
            assert servers
            for p in servers:  # the model path arrives whole, as one argument
                where = {"vllm": 1, "trtllm": 0}.get(program(p))
                got = p["argv"][where] if where is not None else options(p["argv"])["--model-path"][0][0]
                assert got == f"PATH/TO/{name}"


def test_a_config_json_name_with_backticks_is_quoted(tmp_path):
    model = model_from_dict(dict(HF, _name_or_path="org/`touch PWNED`"))
    text = launch(Scenario(Deployment(Node(GPUS["h100-sxm"], 8, 8), model)))["vllm"]
    procs = run_set(text, tmp_path)
    assert not (tmp_path / "PWNED").exists() and procs[0]["argv"][1] == "PATH/TO/org/`touch PWNED`"


def test_a_comment_stays_one_line():
    from batching.studies.launch_flags import command
    text = command(["vllm", "serve", "m"], [], ["GPU H100\ntouch PWNED\x1b[2J"])
    assert text.splitlines() == ["# GPU H100\\ntouch PWNED\\x1b[2J", "vllm serve m"]


def _split_checks(procs):
    gpus, ports = [], []
    for p in procs:
        if p["env"].get("CUDA_VISIBLE_DEVICES"):
            gpus.append({int(g) for g in p["env"]["CUDA_VISIBLE_DEVICES"].split(",")})
    assert sum(map(len, gpus)) == len(set().union(*gpus)), "two instances share a GPU"
    for p in procs:
        o = options(p["argv"])
        ports.append(int(o["--port"][0][0]))
    assert len(ports) == len(set(ports)), "two processes share a port"
    return gpus


def test_a_vllm_split_on_one_node_starts_as_printed(tmp_path):
    sc = Scenario(policy=PRESETS["chunked"], disagg=Disagg(2, 2, 1, 4))
    procs = run_set(launch(sc)["vllm"], tmp_path)
    servers = [p for p in procs if program(p) == "vllm"]
    proxy = [p for p in procs if program(p) == "vllm_proxy"]
    assert len(servers) == 3 and len(proxy) == 1
    gpus = _split_checks(procs)
    assert sorted(map(len, gpus)) == [2, 2, 4] and set().union(*gpus) == set(range(8))
    side = []  # the NIXL side channel: each TP rank listens on the base port + its rank
    for p in servers:
        base, tp = int(p["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]), int(options(p["argv"])["--tensor-parallel-size"][0][0])
        side += range(base, base + tp)
    assert len(side) == len(set(side)) == 8
    o = options(proxy[0]["argv"])
    by_tp = {int(options(p["argv"])["--tensor-parallel-size"][0][0]): p for p in servers}
    prefill_ports = sorted(int(options(p["argv"])["--port"][0][0]) for p in servers
                           if options(p["argv"])["--tensor-parallel-size"] == [["2"]])
    assert sorted(map(int, o["--prefiller-ports"][0])) == prefill_ports
    assert o["--decoder-ports"] == [options(by_tp[4]["argv"])["--port"][0]]
    assert o["--prefiller-hosts"] == [["localhost", "localhost"]] and o["--decoder-hosts"] == [["localhost"]]


def test_an_sglang_split_on_one_node_starts_as_printed(tmp_path):
    sc = Scenario(policy=PRESETS["chunked"], disagg=Disagg(1, 4, 2, 2))
    procs = run_set(launch(sc)["sglang"], tmp_path)
    servers = [p for p in procs if program(p) == "sglang"]
    router = [p for p in procs if program(p) == "sglang_router"]
    assert len(servers) == 3 and len(router) == 1
    gpus = _split_checks(procs)
    assert set().union(*gpus) == set(range(8))
    o = options(router[0]["argv"])
    assert o["--pd-disaggregation"] == [[]]
    prefills = [options(p["argv"]) for p in servers if options(p["argv"])["--disaggregation-mode"] == [["prefill"]]]
    decodes = [options(p["argv"]) for p in servers if options(p["argv"])["--disaggregation-mode"] == [["decode"]]]
    assert len(prefills) == 1 and len(decodes) == 2
    # the servers start in the background, so they record in any order
    assert sorted(o["--prefill"]) == sorted([f"http://127.0.0.1:{s['--port'][0][0]}",
                                             s["--disaggregation-bootstrap-port"][0][0]] for s in prefills)
    assert sorted(o["--decode"]) == sorted([f"http://127.0.0.1:{s['--port'][0][0]}"] for s in decodes)


def test_a_split_over_two_nodes_names_each_node():
    dep = Deployment(Node(GPUS["h200-sxm"], 8, 8), MODELS["deepseek-v3"], "fp8")
    v = launch(Scenario(dep, policy=PRESETS["chunked"], nodes=2, disagg=Disagg(1, 8, 1, 8)))["vllm"]
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT=5600 VLLM_NIXL_SIDE_CHANNEL_HOST=NODE1_IP" in v
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT=5600 VLLM_NIXL_SIDE_CHANNEL_HOST=NODE2_IP" in v
    assert "--prefiller-hosts NODE1_IP" in v and "--decoder-hosts NODE2_IP" in v
