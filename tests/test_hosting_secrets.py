"""Issue 39 item 13, against a running server on 127.0.0.1: a secrets file Streamlit cannot start with (not UTF-8,
``auth`` not a table) no longer makes the service exit (and crash-loop under systemd or Docker): the deploy files'
launcher (``python -m batching.ui.serve``) starts the server without it and every page serves only the error, naming
the file; a misspelt ``[Auth]`` or a number where ``st.login`` needs a string closes the dashboard with an error
instead of leaving it open. No simulation runs (every page stops at the error). About 40 s."""
from __future__ import annotations

import asyncio
import configparser
import sys
from pathlib import Path

import pytest
from stclient import Session
from streamlit_server import ROOT, StreamlitServer

from batching.ui import access
from batching.ui.safe import unescape

LAUNCHER = [sys.executable, "-m", "batching.ui.serve"]
KEYS = ('redirect_uri = "http://127.0.0.1:8501/oauth2callback"\ncookie_secret = "' + "x" * 32 + '"\n'
        'client_id = "dashboard"\nclient_secret = "s"\n'
        'server_metadata_url = "https://idp.example.com/.well-known/openid-configuration"\n')
CASES = {  # name: (file bytes, a word the error must show besides the file's path)
    "not-utf8": (b'[auth]\nredirect_uri = "\xff"\n', "cannot be read"),
    "auth-not-a-table": (b"auth = 5\n", "auth must be a table"),
    "misspelt-section": (("[Auth]\n" + KEYS).encode(), "[Auth] is not read"),
    "number-for-a-secret": (("[auth]\n" + KEYS.replace('"' + "x" * 32 + '"', "12345")).encode(), "cookie_secret"),
}


async def _visit(url: str) -> tuple[list[str], int]:
    session = await Session(url).open(until="Strategy showdown")
    try:
        return session.texts, await asyncio.to_thread(session.put, b"x" * 1024)
    finally:
        await session.close()


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_secrets_file_serves_only_an_error_and_the_server_stays_up(case, tmp_path):
    data, word = CASES[case]
    secrets = tmp_path / "secrets.toml"
    secrets.write_bytes(data)
    # StreamlitServer fails when the process exits before /_stcore/health answers (what the crash loop was)
    with StreamlitServer(f"secrets-{case}.log", cmd=LAUNCHER, args=["--secrets.files", str(secrets)]) as server:
        texts, upload = asyncio.run(_visit(server.url))
        alive = server.proc.poll() is None
    errors = [unescape(t) for t in texts if access.BROKEN in t]
    assert alive and errors, texts
    assert str(secrets) in errors[0] and word in errors[0], errors[0]
    assert not any("Strategy showdown" in t for t in texts), texts  # no page behind the error
    assert upload == 403


def test_a_misspelt_section_closes_the_dashboard_under_plain_streamlit_run(tmp_path):
    """The pages' own check, without the launcher: ``streamlit run app.py`` as the README's local command."""
    secrets = tmp_path / "secrets.toml"
    secrets.write_text("[AUTH]\n" + KEYS)
    with StreamlitServer("secrets-misspelt-plain.log", args=["--secrets.files", str(secrets)]) as server:
        texts, _ = asyncio.run(_visit(server.url))
    errors = [unescape(t) for t in texts if access.BROKEN in t]
    assert errors and "[AUTH] is not read" in errors[0], texts
    assert not any("Strategy showdown" in t for t in texts), texts


def test_the_deploy_files_start_the_launcher_and_do_not_restart_forever():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "deploy" / "batching-explorer.service")
    assert "-m batching.ui.serve" in unit["Service"]["ExecStart"], unit["Service"]["ExecStart"]
    # systemd gives up after StartLimitBurst starts within StartLimitIntervalSec (a crash at start-up of another kind)
    assert int(unit["Unit"]["StartLimitBurst"]) <= 5 and int(unit["Unit"]["StartLimitIntervalSec"]) >= 300
    assert int(unit["Service"]["RestartSec"]) >= 10
    docker_cmd = [ln for ln in (ROOT / "deploy" / "Dockerfile").read_text().splitlines() if ln.startswith("CMD")]
    assert docker_cmd and '"-m", "batching.ui.serve"' in docker_cmd[0], docker_cmd


def test_the_launcher_leaves_good_secrets_to_streamlit(tmp_path):
    from batching.ui import serve

    secrets = tmp_path / "secrets.toml"
    secrets.write_text("[auth]\n" + KEYS)
    assert serve.check(["--secrets.files", str(secrets)]) is None
    cmd, env = serve.command(["--secrets.files", str(secrets), "--server.port", "1"], None)
    assert cmd[-4:] == ["--secrets.files", str(secrets), "--server.port", "1"]
    assert access.LAUNCH_PROBLEM_ENV not in env
    cmd, env = serve.command(["--secrets.files", str(secrets)], "broken")
    assert str(secrets) not in cmd and env[access.LAUNCH_PROBLEM_ENV] == "broken"
    assert not Path(cmd[cmd.index("--secrets.files") + 1]).exists()
