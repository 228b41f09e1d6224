import builtins
import os
import sys
from pathlib import Path

import pytest

# shared test helpers (streamlit_server.py) import from every test folder
sys.path.insert(0, str(Path(__file__).resolve().parent))
# no background compile of every feature from the dashboards the tests start (ui.compile_notice): it would take a
# core for minutes; tests/test_first_use.py turns it on where it tests it
os.environ.setdefault("BATCHING_PREPARE", "off")


@pytest.fixture
def without_ray(monkeypatch):
    """Importing ``ray`` fails, as on a machine without requirements-cluster.txt."""
    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
