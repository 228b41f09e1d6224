"""The speculative-decoding flags of the CLI (issue 13 §1): the knobs reach the policy, the summary gains its
figures, and bad values or combinations are one-line errors, never a traceback."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from batching.cli.args import SPEC_KEYS
from batching.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_run_with_eagle_prints_and_writes_the_speculation_figures(tmp_path, capsys):
    out = tmp_path / "s.json"
    rc = main(["run", "--requests", "60", "--rate", "1", "--spec-decode", "eagle", "--spec-tokens", "4",
               "--spec-acceptance", "0.7", "--spec-disable-batch-size", "32", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "speculative decoding (eagle, K=4, A=0.7, off at 32+ seqs)" in text
    assert "mean_tokens_per_step" in text
    s = json.loads(out.read_text())
    assert [k for k in s if k in SPEC_KEYS] == list(SPEC_KEYS)
    exp = (1 - 0.7 ** 5) / (1 - 0.7)
    assert abs(s["mean_tokens_per_step"] - exp) < 0.15 * exp


def test_run_without_speculation_has_no_speculation_keys(tmp_path):
    out = tmp_path / "s.json"
    assert main(["run", "--requests", "30", "--rate", "1", "--json", str(out)]) == 0
    assert not set(json.loads(out.read_text())) & set(SPEC_KEYS)


def test_draft_model_flag_reaches_the_policy():
    from batching.cli.args import build_scenario
    from batching.cli.main import make_parser

    args = make_parser().parse_args(["run", "--spec-decode", "draft", "--spec-draft-model", "llama-3.1-8b",
                                      "--model", "llama-3.1-70b"])
    pol = build_scenario(args).policy
    assert (pol.spec_decode, pol.spec_draft_model, pol.spec_tokens, pol.spec_acceptance) == \
        ("draft", "llama-3.1-8b", 3, 0.8)


@pytest.mark.parametrize("argv, needle", [
    (["run", "--spec-decode", "medusa"], "argument --spec-decode: invalid choice: 'medusa'"),
    (["run", "--spec-decode", "eagle", "--spec-tokens", "0"], "argument --spec-tokens: 0 is out of range; allowed "
                                                              "1 to 16"),
    (["run", "--spec-decode", "eagle", "--spec-tokens", "2.5"], "argument --spec-tokens: 2.5 is not a whole number"),
    (["run", "--spec-decode", "eagle", "--spec-acceptance", "1.5"], "argument --spec-acceptance: 1.5 is out of "
                                                                    "range; allowed 0 to 1"),
    (["run", "--spec-decode", "eagle", "--spec-acceptance", "nan"], "argument --spec-acceptance: 'nan'"),
    (["run", "--spec-decode", "eagle", "--spec-disable-batch-size", "-1"], "argument --spec-disable-batch-size: "
                                                                           "-1 is out of range; allowed 0 to 4096"),
    (["run", "--spec-decode", "draft", "--spec-draft-model", "gpt-5"], "argument --spec-draft-model: invalid choice"),
    (["run", "--spec-tokens", "4"], "--spec-tokens: tunes speculative decoding; add --spec-decode"),
    (["run", "--spec-decode", "eagle", "--spec-draft-model", "qwen2.5-7b"],
     "--spec-draft-model: is the draft model of --spec-decode draft (--spec-decode is eagle)"),
    (["run", "--preset", "static", "--spec-decode", "eagle"], "--spec-decode eagle: needs iteration-level batching"),
])
def test_bad_spec_flags_one_line_exit_2(argv, needle):
    p = subprocess.run([sys.executable, "-m", "batching", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
