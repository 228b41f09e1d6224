import builtins
import sys
from pathlib import Path

import pytest

# shared test helpers (streamlit_server.py) import from every test folder
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def without_ray(monkeypatch):
    """Importing ``ray`` fails, as on a machine without requirements-cluster.txt."""
    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
