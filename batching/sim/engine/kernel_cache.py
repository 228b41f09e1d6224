"""Where Numba keeps the compiled kernels, keyed by the kernel sources.

Numba checks only the file of the function it caches: the engine's cached code inlines the
cost model, so an edited hardware/costmodel.py would be served stale. The cache therefore lives in a
directory named after a hash of every module with jitted code and of the modules whose constants
Numba freezes into it (engine/state.py; hardware/specs.py, whose KV_BLOCK_TOKENS the engine divides
by); ``NUMBA_CACHE_DIR`` (for a read-only install or a hosted server) chooses its parent.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

SIM_DIR = Path(__file__).resolve().parents[1]  # batching/sim/
# every module whose code or constants the kernels compile in, relative to batching/sim/
KERNEL_SOURCES = ("hardware/costmodel.py", "hardware/specs.py", "engine/state.py", "engine/stages.py", "engine/kernel.py",
                  "topology/fleet.py", "topology/disagg.py")


def sources_digest(package_dir: Path = SIM_DIR) -> str:
    h = hashlib.sha256()
    for name in KERNEL_SOURCES:
        h.update(name.encode())
        h.update((package_dir / name).read_bytes())
    return h.hexdigest()[:16]


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def cache_dir() -> Path:
    """NUMBA_CACHE_DIR/<digest> if set; else the package's __pycache__, or the user cache
    directory when the package is read-only."""
    digest = f"kernels-{sources_digest()}"
    user = os.environ.get("NUMBA_CACHE_DIR")
    if user:
        return Path(user) / digest
    local = SIM_DIR / "__pycache__" / digest
    if _writable(local):
        return local
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    fallback = base / "batching-explorer" / digest
    return fallback if _writable(fallback) else Path(tempfile.gettempdir()) / "batching-explorer" / digest


_ACTIVE: list[Path] = []


def configure() -> Path:
    """Point Numba's cache at ``cache_dir()``; call before any jitted module is imported."""
    from numba import config

    path = cache_dir()
    config.CACHE_DIR = str(path)
    _ACTIVE[:] = [path]
    return path


def active_dir() -> Path:
    """The directory Numba caches into (``configure``'s), where first_use keeps its markers."""
    return _ACTIVE[0] if _ACTIVE else cache_dir()
