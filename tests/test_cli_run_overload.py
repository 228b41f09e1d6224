"""``run`` says overload as ``compare`` does (issue 24 item 8): load, overloaded and queue_growth_req_s printed and
written (JSON, summary.csv), an overloaded run's latencies marked unbounded."""
import json

import pandas as pd
import pytest

from batching.cli.compare import COMPARE_JSON_KEYS
from batching.cli.args import build_scenario
from batching.cli.main import main, make_parser
from batching.studies.compare import compare

N = 200


def _argv(rate: float) -> list[str]:
    return ["run", "--preset", "continuous", "--rate", str(rate), "--requests", str(N)]


def _compare_figures(rate: float) -> dict:
    """What compare's study says of this policy on the scenario run builds from the same flags."""
    sc = build_scenario(make_parser().parse_args(_argv(rate)))
    return compare(sc, {"continuous": sc.policy}).summaries()["continuous"]


@pytest.mark.parametrize("rate, over", [(40.0, True), (0.5, False)])
def test_run_prints_and_writes_load_and_overload_as_compare(tmp_path, capsys, rate, over):
    rc = main([*_argv(rate), "--json", str(tmp_path / "s.json"), "--csv", str(tmp_path / "csv")])
    assert rc == 0
    out = capsys.readouterr().out
    s = json.loads((tmp_path / "s.json").read_text())
    want = _compare_figures(rate)
    for key in COMPARE_JSON_KEYS:  # the same figures compare writes for this policy on this scenario
        assert s[key] == pytest.approx(want[key], nan_ok=True), key
    assert s["overloaded"] is over
    assert (s["load"] > 0.9) if over else (s["load"] < 0.3)
    lines = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(("#", "class"))}
    assert lines["overloaded"].split()[1] == str(over)
    assert float(lines["load"].split()[1]) == pytest.approx(s["load"], rel=1e-3)
    assert "queue_growth_req_s" in lines
    assert ("unbounded" in lines["ttft_p99_s"]) is over
    assert ("# overloaded at" in out) is over
    row = pd.read_csv(tmp_path / "csv" / "summary.csv").iloc[0]
    assert bool(row["overloaded"]) is over
    assert row["load"] == pytest.approx(s["load"])
    assert row["queue_growth_req_s"] == pytest.approx(s["queue_growth_req_s"], nan_ok=True)
