"""Issue 39 item 13, the shipped proxy (deploy/nginx-batching-explorer.conf) in front of a running server, both on
127.0.0.1: /_stcore/metrics is not served through it; an upload without Streamlit's sign-in cookie ends at the proxy
(403, before its body reaches the server); with a forged cookie it reaches the dashboard, which refuses it; a body over
the upload limit is refused (413); uploads past the per-client rate get 429; the page itself (and its WebSocket) works
through the proxy. Needs nginx (skipped without it). About 20 s."""
from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from stclient import Session, rss_mib, upload_response
from streamlit_server import ROOT, StreamlitServer, free_port

from batching.ui import access, upload_guard

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if shutil.os.path.exists("/usr/sbin/nginx") else None)
CONF = ROOT / "deploy" / "nginx-batching-explorer.conf"
AUTH = ('[auth]\nredirect_uri = "http://127.0.0.1:8501/oauth2callback"\ncookie_secret = "' + "x" * 32 + '"\n'
        'client_id = "dashboard"\nclient_secret = "s"\n'
        'server_metadata_url = "https://idp.example.com/.well-known/openid-configuration"\n')
FORGED = "_streamlit_user=forged"


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:  # not listening yet
        return 0


class Proxy:
    """nginx running the shipped file (its "# tls" lines left out) on a free loopback port, in front of ``upstream``."""

    def __init__(self, tmp_path, upstream_port: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        site = "\n".join(ln for ln in CONF.read_text().splitlines() if not ln.rstrip().endswith("# tls"))
        site = site.replace("server 127.0.0.1:8501;", f"server 127.0.0.1:{upstream_port};")
        site = re.sub(r"^(\s*)(server_name [^;\n]+;)", rf"\1listen 127.0.0.1:{self.port};\n\1\2", site, count=1,
                      flags=re.MULTILINE)
        (tmp_path / "site.conf").write_text(site)
        (tmp_path / "nginx.conf").write_text(
            f"daemon off;\nmaster_process off;\nworker_processes 1;\npid {tmp_path}/nginx.pid;\n"
            f"error_log {tmp_path}/error.log warn;\nevents {{ worker_connections 64; }}\n"
            f"http {{\n  access_log off;\n  client_body_temp_path {tmp_path}/body;\n  proxy_temp_path {tmp_path}/proxy;\n"
            f"  include {tmp_path}/site.conf;\n}}\n")
        self.cmd = [NGINX, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")]

    def __enter__(self) -> "Proxy":
        check = subprocess.run([*self.cmd, "-t"], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while _status(f"{self.url}/_stcore/health") != 200:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.__exit__()
                raise AssertionError(f"nginx did not start; see {self.url} and error.log")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


async def _through_the_proxy(proxy: Proxy, server: StreamlitServer) -> dict:
    session = await Session(proxy.url).open()  # the WebSocket through the proxy
    try:
        sid, xsrf = session.session_id, session.xsrf
        put = lambda data, cookies="": upload_response(proxy.url, sid, data, xsrf, cookies=cookies)  # noqa: E731
        before = rss_mib(server.proc.pid)
        out = {"prompt": access.PROMPT in session.texts,
               "no_cookie": await asyncio.to_thread(put, b"x" * (40 * 1024 * 1024)),
               "forged": await asyncio.to_thread(put, b"x" * 1024, FORGED),
               "too_large": await asyncio.to_thread(put, b"x" * (52 * 1024 * 1024), FORGED)}
        out["burst"] = [(await asyncio.to_thread(put, b"x", FORGED))[0] for _ in range(10)]
        out["rss"] = (before, rss_mib(server.proc.pid))
        return out
    finally:
        await session.close()


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_the_shipped_proxy_closes_metrics_and_uploads_before_sign_in(tmp_path):
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(AUTH)
    with StreamlitServer("proxy-upstream.log", args=["--secrets.files", str(secrets)]) as server, \
            Proxy(tmp_path, server.port) as proxy:
        assert _status(f"{server.url}/_stcore/metrics") == 200  # Streamlit serves it to anyone who reaches it
        assert _status(f"{proxy.url}/_stcore/metrics") == 403
        assert _status(f"{proxy.url}/_stcore/metrics?families=session_state") == 403
        got = asyncio.run(_through_the_proxy(proxy, server))
    print(f"\nthrough the proxy: {got}")
    assert got["prompt"]
    status, body = got["no_cookie"]
    assert status == 403 and b"nginx" in body, got["no_cookie"]  # refused by the proxy itself
    status, body = got["forged"]
    assert status == 403 and upload_guard.REFUSED.encode() in body, got["forged"]  # by the dashboard
    assert got["too_large"][0] == 413, got["too_large"]
    assert got["burst"].count(429) >= 3 and set(got["burst"]) <= {403, 429}, got["burst"]
    before, after = got["rss"]
    assert after - before < 60, got["rss"]
