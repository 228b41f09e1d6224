import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from batching.cli.compare import COMPARE_JSON_KEYS
from batching.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["num_requests", "rejected_requests", "num_steps", "throughput_output_tok_s", "steady_output_tok_s",
        "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s", "gpu_util", "busy", "mfu", "mbu",
        "batch_efficiency", "preemptions", "by_priority"]


def test_run_writes_json_and_csv(tmp_path, capsys):
    rc = main(["run", "--preset", "chunked", "--rate", "2", "--requests", "120", "--json", str(tmp_path / "s.json"),
               "--csv", str(tmp_path / "csv")])
    assert rc == 0
    s = json.loads((tmp_path / "s.json").read_text())
    # chunked caches prefixes: its hit rate and cached prompt tokens follow the documented keys (once the engine
    # reports them)
    engine = "prefix_hit_rate" in (ROOT / "batching" / "sim" / "metrics.py").read_text()
    base = KEYS[:-1] + (["prefix_hit_rate", "cached_prompt_tokens"] if engine else []) + ["by_priority"]
    base += ["engine", "engine_label"]  # the profile it ran with
    assert list(s) == base + [k for k in COMPARE_JSON_KEYS if k not in base]  # capacity, load, overload as compare
    assert (s["engine"], s["engine_label"]) == ("vllm", "vLLM 0.11")
    assert s["num_requests"] == 120
    assert set(s["by_priority"]) == {"0", "1"}
    assert s["by_priority"]["0"]["class_name"] == "interactive chat"
    req = pd.read_csv(tmp_path / "csv" / "requests.csv")
    steps = pd.read_csv(tmp_path / "csv" / "steps.csv")
    assert len(req) == 120 and len(steps) == s["num_steps"]
    assert req.output_tokens.sum() == steps.decode_tokens.sum() + (req.output_tokens >= 1).sum()
    assert "throughput_output_tok_s" in capsys.readouterr().out


def test_run_policy_flags_change_the_result(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    base = ["run", "--preset", "dynamic", "--rate", "0.05", "--requests", "40"]
    main(base + ["--max-wait-ms", "10", "--json", str(a)])
    main(base + ["--max-wait-ms", "2000", "--json", str(b)])
    assert json.loads(b.read_text())["ttft_p50_s"] > json.loads(a.read_text())["ttft_p50_s"]


def test_fixed_lengths_and_kv_override(tmp_path):
    out = tmp_path / "s.json"
    assert main(["run", "--prompt-tokens", "500", "--output-tokens", "400", "--requests", "30", "--rate", "50",
                 "--kv-cache-tokens", "2048", "--preemption", "swap", "--json", str(out),
                 "--csv", str(tmp_path / "csv")]) == 0
    s = json.loads(out.read_text())
    req = pd.read_csv(tmp_path / "csv" / "requests.csv")
    steps = pd.read_csv(tmp_path / "csv" / "steps.csv")
    assert (req.prompt_tokens == 500).all() and (req.output_tokens == 400).all()
    # by hand: 2,048 tokens of KV cache are 128 blocks of 16. A request's 500-token prompt takes 32 blocks, and by
    # its last step it holds the KV of 899 tokens (all but its last output token), 57 blocks: two fit to the end
    # (114 blocks), three do not (171). Four prompts are admitted side by side (128 blocks: vLLM V1 keeps no
    # admission watermark), five never are, so the cache fills to exactly 128 blocks and then a running request
    # is swapped out to the CPU to make room.
    assert steps.running.max() == 4 and steps.kv_blocks.max() == 128
    assert steps.swapped.max() >= 1 and steps.swap_tokens.sum() > 0
    assert s["preemptions"] == req.preemptions.sum() == steps.preempted.sum() > 0
    assert s["num_steps"] == len(steps)


def test_trace_replay(tmp_path):
    out = tmp_path / "s.json"
    rc = main(["run", "--trace", str(ROOT / "assets" / "sample_trace.csv"), "--requests", "200",
               "--json", str(out)])
    assert rc == 0 and json.loads(out.read_text())["num_requests"] == 200


def test_compare_json(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["compare", "--requests", "150", "--rate", "3", "--json", str(out)]) == 0
    c = json.loads(out.read_text())
    assert list(c) == ["static", "dynamic", "continuous", "chunked", "priority"]
    assert c["continuous"]["capacity_output_tok_s"] > c["static"]["capacity_output_tok_s"]
    table = capsys.readouterr().out
    assert "static" in table and "priority" in table


@pytest.mark.parametrize("argv, needle", [
    (["run", "--rate", "-3"], "rate"),
    (["run", "--requests", "abc"], "requests"),
    (["run", "--preemption", "maybe"], "preemption"),
    (["run", "--tp", "1"], "does not fit"),
    (["run", "--max-num-seqs", "99999"], "--max-num-seqs: 99999 is out of range; allowed 1 to 4096"),
    (["run", "--trace", "/nonexistent.csv"], "no such file"),
    (["run", "--max-num-batched-tokens", "100"], "max_num_batched_tokens"),
    # numbers written oddly: the message says what is wrong with that flag
    (["run", "--requests", "１２"], "argument --requests: '１２' has characters other than ASCII (full-width digits?)"),
    (["run", "--tp", "８"], "argument --tp: '８' has characters other than ASCII"),
    (["run", "--requests", "1e30"], "argument --requests: 1e30 is out of range; allowed 1 to 1000000"),
    (["run", "--seed", "1e30"], "argument --seed: 1e30 is out of range; allowed 0 to 9223372036854775807"),
    (["run", "--requests", "2.5"], "argument --requests: 2.5 is not a whole number; allowed 1 to 1000000"),
    (["run", "--rate", "nan"], "argument --rate: 'nan' is not a finite number; allowed > 0 to 10000"),
    (["sweep", "--knob", "max_num_seqs", "--values", "16,nan,32"], "argument --values: 'nan' is not a finite number"),
    (["sweep", "--knob", "max_num_seqs", "--values", "16,1e30"], "--values: max_num_seqs=1e+30 is out of range; "
                                                                  "allowed 1 to 4096"),
    (["sweep", "--knob", "max_num_seqs", "--values", "16.5"], "--values: max_num_seqs=16.5 is not a whole number"),
    (["sweep", "--knob", "max_num_seqs", "--values", "１６"], "argument --values: '１６' has characters other than "
                                                             "ASCII"),
    # the old cap: 10^7 requests tried to reserve 47.7 GiB and died with a traceback
    (["run", "--requests", "10000000"], "argument --requests: 10000000 is out of range; allowed 1 to 1000000"),
    (["run", "--rate", "0.0000001", "--requests", "1000000"], "puts the last arrival at 1.001e+13 s; allowed up to "
                                                              "8.796e+12 s"),
    (["capacity", "--requests", "10"], "give at least one SLO: --slo-ttft-ms, --slo-tpot-ms or --slo-e2e-s"),
    # per-class SLOs: one value or one per class, each in range; the message names the flag, value and range
    (["capacity", "--slo-ttft-ms", "1000,30000,5", "--requests", "10"],
     "--slo-ttft-ms: 3 values for 2 classes (interactive chat, batch analysis); give 1 value (every class) or 2, "
     "class 0 first"),
    (["capacity", "--slo-ttft-ms", "0"], "argument --slo-ttft-ms: 0 is out of range; allowed > 0 to 3,600,000"),
    (["capacity", "--slo-tpot-ms", "100,x"], "argument --slo-tpot-ms: 'x' is not a number; allowed > 0 to 3,600,000"),
    (["capacity", "--slo-ttft-ms", "1000,"], "argument --slo-ttft-ms: an empty value in '1000,'"),
    (["capacity", "--slo-e2e-s", "5,5000"], "argument --slo-e2e-s: 5000 is out of range; allowed > 0 to 3,600"),
    (["capacity", "--slo-ttft-ms", "1000", "--headroom", "0.5"], "argument --headroom: 0.5 is out of range; allowed "
                                                                  "1 to 3"),
    (["sweep", "--knob", "max_num_seqs", "--values", "8,16", "--workload", "chat", "--slo-ttft-ms", "1000,2000"],
     "--slo-ttft-ms: 2 values for 1 class (chat); give 1 value"),
    (["run", "--preset", "x" * 5000], "invalid choice: '" + "x" * 200 + "...'"),  # quotes 200 characters at most
])
def test_bad_flags_one_line_exit_2(argv, needle):
    p = subprocess.run([sys.executable, "-m", "batching", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and needle in lines[0]
    assert "Traceback" not in p.stderr


def test_malformed_trace_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,-4,5\n")
    p = subprocess.run([sys.executable, "-m", "batching", "run", "--trace", str(bad)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "row 2" in p.stderr and "prompt_tokens" in p.stderr


# ---------------------------------------------------------------- no traceback, on any input


def _python_m_batching(*argv: str, module: str = "batching") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def _one_line_exit_2(p: subprocess.CompletedProcess) -> str:
    """The one stderr line of a refused command (exit code 2, no traceback, nothing simulated on stdout)."""
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("python -m batching")
    assert p.stdout == ""
    return lines[0]


def _imports(path: Path) -> set[str]:
    """Every batching.* module ``path`` imports, at the top or inside a function."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("batching.")}


def test_cli_modules_import_downward_only_and_never_main():
    """One module per command; what they share is args.py; none imports main.py (today's cycle main <-> report
    made ``python -m batching.cli.main report --trace missing.csv`` raise a second copy's CliError)."""
    cli = ROOT / "batching" / "cli"
    names = sorted(p.stem for p in cli.glob("*.py") if p.stem != "__init__")
    assert {"args", "main", "run", "compare", "sweep", "capacity", "report", "calibrate"} <= set(names)
    graph = {n: {m.split(".")[2] for m in _imports(cli / f"{n}.py") if m.startswith("batching.cli.")
                 and m.split(".")[2] in names} - {n} for n in names}
    for n, deps in graph.items():
        assert "main" not in deps, f"batching/cli/{n}.py imports main.py"
    assert graph["args"] == set(), "args.py is the bottom of the CLI: it imports no command"
    assert graph["main"] >= {"run", "compare", "sweep", "capacity", "report", "calibrate"}  # and registers them

    def reach(n: str, seen: tuple[str, ...] = ()) -> None:  # depth-first: a module met again on its own path
        assert n not in seen, f"import cycle: {' -> '.join((*seen, n))}"
        for m in graph[n]:
            reach(m, (*seen, n))

    for n in names:
        reach(n)


@pytest.mark.parametrize("module", ["batching", "batching.cli.main"])
def test_report_with_a_missing_trace_is_one_line(tmp_path, module):
    p = _python_m_batching("report", "--trace", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "x"),
                           "--no-png", module=module)
    line = _one_line_exit_2(p)
    assert line == f"python -m batching: error: --trace '{tmp_path / 'missing.csv'}': no such file"
    assert not (tmp_path / "x").exists()


# custom specs: each hostile file gives one line that names the file and the field
HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
      "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
HOSTILE_SPECS = {
    "infinity.json": (json.dumps(HF).replace('"num_hidden_layers": 32', '"num_hidden_layers": Infinity').encode(),
                      "num_hidden_layers=Infinity is not a finite number"),
    "zero_heads.json": (json.dumps(HF | {"num_attention_heads": 0}).encode(),
                        "num_attention_heads=0 is out of range; allowed 1 to 1024"),
    "list.json": (json.dumps(HF | {"hidden_size": [4096]}).encode(), "hidden_size=<a JSON array> is not a number"),
    "digits.json": (json.dumps(HF | {"vocab_size": int("9" * 400)}).encode(),
                    "vocab_size=<a 400-digit number> is out of range; allowed 1 to 4194304"),
    "nested.json": (b"[" * 100_000 + b"]" * 100_000, "not valid JSON: arrays or objects nested too deeply"),
    "latin1.json": (json.dumps(HF | {"_name_or_path": "caf\u00e9"}, ensure_ascii=False).encode("latin-1"),
                    "not UTF-8 text: byte 0xe9 at offset"),
    "huge_int.json": (json.dumps(HF | {"num_hidden_layers": 1e30}).encode(),
                      "num_hidden_layers=1e+30 is out of range; allowed 1 to 1000"),
    "mamba.json": (json.dumps({"architectures": ["MambaForCausalLM"], "model_type": "mamba", "num_hidden_layers": 64,
                               "hidden_size": 2560, "vocab_size": 50280, "state_size": 16}).encode(),
                   "architectures=MambaForCausalLM is not supported: a state-space or recurrent model"),
}


@pytest.mark.parametrize("name", list(HOSTILE_SPECS))
def test_hostile_model_json_is_one_line_naming_file_and_field(tmp_path, name):
    data, message = HOSTILE_SPECS[name]
    path = tmp_path / name
    path.write_bytes(data)
    line = _one_line_exit_2(_python_m_batching("run", "--model-json", str(path), "--requests", "10"))
    assert line.startswith(f"python -m batching: error: model file {path}: "), line
    assert message in line
    assert len(line) < 600


def test_a_name_or_path_of_any_length_is_accepted(tmp_path):
    path = tmp_path / "long.json"
    path.write_text(json.dumps(HF | {"_name_or_path": "/home/me/" + "m" * 5000 + "/Llama-3.1-8B-Instruct"}))
    out = tmp_path / "s.json"
    assert main(["run", "--model-json", str(path), "--tp", "1", "--requests", "20", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["num_requests"] == 20


# output paths: refused before anything is simulated


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in (a 0555 folder; as root, /sys)."""
    import tempfile

    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            with tempfile.TemporaryFile(dir=candidate):
                pass
        except OSError:
            return candidate
    pytest.skip("no folder here refuses writes")


def test_output_paths_are_checked_before_the_simulation(tmp_path, monkeypatch, capsys):
    import batching.cli.compare
    import batching.cli.report
    import batching.cli.run
    import batching.cli.sweep

    def no_simulation(*a, **k):
        raise AssertionError("simulated before checking the output paths")

    for module, name in ((batching.cli.run, "simulate"), (batching.cli.compare, "compare"),
                         (batching.cli.sweep, "sweep")):
        monkeypatch.setattr(module, name, no_simulation)
    monkeypatch.setattr(batching.cli.report, "write_report", no_simulation)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    ro = _unwritable_folder(tmp_path)
    cases = [
        (["run", "--json", str(tmp_path)], f"--json '{tmp_path}': a folder, not a file"),
        (["run", "--json", str(a_file / "s.json")], f"--json '{a_file / 's.json'}': cannot create the folder"),
        (["run", "--json", str(ro / "s.json")], f"--json '{ro / 's.json'}': cannot write in the folder '{ro}'"),
        (["run", "--csv", str(a_file)], f"--csv '{a_file}': a file, not a folder"),
        (["run", "--csv", str(a_file / "sub")], f"--csv '{a_file / 'sub'}': cannot create the folder"),
        (["run", "--csv", str(ro)], f"--csv '{ro}': cannot write in the folder"),
        (["compare", "--json", str(tmp_path)], "a folder, not a file"),
        (["sweep", "--knob", "max_num_seqs", "--values", "8,16", "--json", str(ro / "s.json")], "cannot write in"),
        (["report", "--no-png", "--out", str(a_file / "sub")], f"--out '{a_file / 'sub'}': cannot create the folder"),
        (["report", "--no-png", "--out", str(ro)], f"--out '{ro}': cannot write in the folder"),
    ]
    for argv, message in cases:
        assert main([*argv, "--requests", "50"]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (argv, err)


def test_output_path_errors_from_the_shell(tmp_path):
    line = _one_line_exit_2(_python_m_batching("run", "--requests", "1000000", "--json", str(tmp_path)))
    assert line == (f"python -m batching: error: --json '{tmp_path}': a folder, not a file; give a file name, e.g. "
                    f"'{tmp_path / 'summary.json'}'")
    line = _one_line_exit_2(_python_m_batching("run", "--csv", "/proc/no-such-place/out"))
    assert "--csv '/proc/no-such-place/out': cannot create the folder" in line


def test_readme_states_the_request_cap_and_memory_per_request():
    from batching.sim.workload.requests import MAX_NUM_REQUESTS

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Command line")[1].split("\n## ")[0]
    assert f"at most {MAX_NUM_REQUESTS:,} requests per simulation" in section
    assert "KB per request" in section and "benchmarks/bench_memory.py" in section
    assert (ROOT / "benchmarks" / "bench_memory.py").is_file()


# ---------------------------------------------------------------- per-class SLOs and headroom


def test_capacity_takes_an_slo_per_class(tmp_path):
    """``capacity --slo-ttft-ms 1000,30000 --slo-tpot-ms 100 --headroom 1.2 --json``: the library's figures for the
    same inputs, each class's attainment and goodput at the rate found, nodes and cost with the headroom."""
    import math

    from batching.sim.policy import PRESETS
    from batching.sim.simulate import Scenario
    from batching.sim.workload.requests import workload_preset
    from batching.studies.capacity import SLO, capacity

    out = tmp_path / "c.json"
    p = _python_m_batching("capacity", "--preset", "priority", "--slo-ttft-ms", "1000,30000", "--slo-tpot-ms", "100",
                           "--requests", "400", "--target-rate", "30", "--gpu-hour-usd", "2.5", "--headroom", "1.2",
                           "--json", str(out))
    assert p.returncode == 0, p.stderr
    c = json.loads(out.read_text())
    assert list(c)[:4] == ["max_rate_req_s", "steady_output_tok_s", "goodput_req_s", "binding_slo"]
    assert c["gpu_hour_usd"] == 2.5 and c["gpu_hour_usd_source"] == "given"
    assert c["slo"] == {"ttft_s": [1.0, 30.0], "tpot_s": 0.1, "e2e_s": None, "attainment": 0.99}
    lib = capacity(Scenario(workload=workload_preset("mixed", 3.0, 400, 0)), SLO(ttft_s=(1.0, 30.0), tpot_s=0.1),
                   policy=PRESETS["priority"], target_rate_req_s=30.0, gpu_hour_usd=2.5, headroom=1.2)
    for key in ("max_rate_req_s", "steady_output_tok_s", "goodput_req_s", "usd_per_million_output_tokens",
                "usd_per_million_output_tokens_at_capacity", "mean_output_tokens"):
        assert c[key] == pytest.approx(lib.to_dict()[key])
    assert (c["binding_slo"], c["binding_class"], c["nodes_needed"]) == (lib.binding_slo, lib.binding_class,
                                                                         lib.nodes_needed)
    assert c["headroom"] == 1.2 and c["nodes_needed"] == math.ceil(30 * 1.2 / c["max_rate_req_s"] - 1e-9)
    by = c["by_priority"]
    assert [by[k]["class_name"] for k in ("0", "1")] == ["interactive chat", "batch analysis"]
    assert by["0"]["slo"] == {"ttft_s": 1.0, "tpot_s": 0.1} and by["1"]["slo"] == {"ttft_s": 30.0, "tpot_s": 0.1}
    for k in ("0", "1"):
        assert 0.99 <= by[k]["attainment"] <= 1 and by[k]["goodput_req_s"] > 0 and by[k]["meets_slo"] is True
        assert by[k]["attainment"] == pytest.approx(lib.by_priority[k]["attainment"])
    assert by["0"]["goodput_req_s"] + by["1"]["goodput_req_s"] == pytest.approx(c["goodput_req_s"])
    assert by["1"]["ttft_p99_s"] > by["0"]["ttft_p99_s"]  # priority: the batch class waits, within its 30 s
    lines = p.stdout.splitlines()
    assert lines[0] == "# engine: vLLM 0.11 profile (vllm)"
    lines = lines[1:]
    assert lines[0].split(None, 1)[1] == ("TTFT ≤ 1,000 ms for interactive chat, 30 s for batch analysis; TPOT ≤ "
                                          "100 ms for 99 % of each class's requests")
    assert "per class, at the rate found (each against its own SLOs at 99 %):" in lines
    assert any(ln.startswith("  0 interactive chat: attainment ") and "(meets its SLOs)" in ln and "(SLO 1,000 ms)" in ln
               for ln in lines)
    assert "price                            given (--gpu-hour-usd)" in lines
    # one value is every class: the same search as the list with that value twice
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    base = ("capacity", "--slo-ttft-ms", "2000", "--requests", "300")
    assert _python_m_batching(*base, "--json", str(one)).returncode == 0
    assert _python_m_batching("capacity", "--slo-ttft-ms", "2000,2000", "--requests", "300", "--json",
                              str(two)).returncode == 0
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert a["max_rate_req_s"] == b["max_rate_req_s"] and a["points"] == b["points"] and a["headroom"] == 1.25
    assert a["slo"]["ttft_s"] == 2.0 and b["slo"]["ttft_s"] == [2.0, 2.0]


def test_sweep_takes_slo_flags(tmp_path):
    """``sweep --slo-ttft-ms X --slo-tpot-ms Y``: each point's capacity within those SLOs, the knee read on it."""
    out = tmp_path / "s.json"
    p = _python_m_batching("sweep", "--preset", "chunked", "--knob", "max_num_seqs", "--values", "8,32,128,512",
                           "--requests", "300", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "100", "--json", str(out))
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["slo"] == {"ttft_s": 2.0, "tpot_s": 0.1, "e2e_s": None, "attainment": 0.99}
    assert doc["slo_default"] is False and doc["knee_basis"] == "max_rate_req_s"
    assert p.stdout.splitlines()[0] == "# engine: vLLM 0.11 profile (vllm)"
    assert p.stdout.splitlines()[1] == "SLOs: TTFT ≤ 2,000 ms; TPOT ≤ 100 ms for 99 % of each class's requests."
    rates = [pt["max_rate_req_s"] for pt in doc["points"]]
    assert rates[1] > rates[0] > 0
    from batching.studies.knee import capacity_knee

    assert doc["knee"] == capacity_knee([8, 32, 128, 512], rates)
    knee_line = [ln for ln in p.stdout.splitlines() if ln.startswith("knee: ")][0]
    if doc["knee"] is None:
        assert knee_line.startswith("knee: none (capacity within the SLOs")
    else:
        assert knee_line.startswith(f"knee: max_num_seqs = {doc['knee']:g} (capacity within the SLOs grows by less "
                                    "than 5 % past it)")
