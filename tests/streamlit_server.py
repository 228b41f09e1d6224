"""A fresh ``streamlit run app.py`` on a free loopback port for browser tests, stopped on exit."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StreamlitServer:
    """Starts the dashboard headless on 127.0.0.1, waits for /_stcore/health (bounded), logs to
    test-artifacts/<log_name>, and stops the process (terminate, then kill) on exit."""

    def __init__(self, log_name: str = "streamlit-server.log", env: dict[str, str] | None = None,
                 args: list[str] | None = None, cmd: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = ARTIFACTS / log_name
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.args = list(args or [])  # more `streamlit run` options, e.g. ["--secrets.files", path]
        self.cmd = cmd  # instead of `python -m streamlit run app.py` (e.g. the deploy files' launcher)

    def __enter__(self) -> "StreamlitServer":
        ARTIFACTS.mkdir(exist_ok=True)
        self._log = self.log_path.open("w")
        cmd = [*(self.cmd or [sys.executable, "-m", "streamlit", "run", "app.py"]), "--server.headless", "true",
               "--server.port", str(self.port), "--server.address", "127.0.0.1",
               "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false", *self.args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"streamlit exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        self.__exit__()
        raise TimeoutError(f"no /_stcore/health within {START_TIMEOUT_S} s; see {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
