import os
import shutil
import subprocess
import sys
from pathlib import Path

from batching.sim.engine import kernel_cache

ROOT = Path(__file__).resolve().parents[1]


def _copy_sources(dest: Path) -> Path:
    """A copy of the kernel sources, in their sub-packages, under ``dest``."""
    for name in kernel_cache.KERNEL_SOURCES:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "batching" / "sim" / name, dest / name)
    return dest


def test_digest_follows_the_kernel_sources(tmp_path):
    pkg = _copy_sources(tmp_path / "sim")
    before = kernel_cache.sources_digest(pkg)
    assert before == kernel_cache.sources_digest(ROOT / "batching" / "sim")
    with open(pkg / "hardware" / "costmodel.py", "a") as f:
        f.write("\n# an edit to the cost model alone\n")
    assert kernel_cache.sources_digest(pkg) != before


def test_every_kernel_module_is_hashed(tmp_path):
    """Each module with jitted code, and the engine's constants (engine_state: numba freezes them
    into the compiled code), keys the cache: an edit to any of them must not be served stale."""
    sim = ROOT / "batching" / "sim"
    jitted = {p.relative_to(sim).as_posix() for p in sim.rglob("*.py") if "@njit" in p.read_text()}
    assert {"hardware/costmodel.py", "engine/kernel.py", "engine/stages.py"} <= jitted
    assert jitted | {"engine/state.py"} <= set(kernel_cache.KERNEL_SOURCES)
    pkg = _copy_sources(tmp_path / "sim")
    before = kernel_cache.sources_digest(pkg)
    for name in ("engine/state.py", "engine/stages.py"):
        text = (pkg / name).read_text()
        (pkg / name).write_text(text + "\n# edited\n")
        assert kernel_cache.sources_digest(pkg) != before
        (pkg / name).write_text(text)
    assert kernel_cache.sources_digest(pkg) == before


def test_numba_cache_dir_is_honoured(tmp_path):
    code = ("from batching.sim.simulate import Scenario, simulate; from batching.sim.workload.requests import workload_preset;"
            "import numba; print(numba.config.CACHE_DIR);"
            "simulate(Scenario(workload=workload_preset('chat', 2.0, 20, 0)))")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=600).stdout.strip()
    assert Path(out).parent == tmp_path and Path(out).name.startswith("kernels-")
    assert list(tmp_path.rglob("*kernel*.nbi")), "the engine kernel was not cached in NUMBA_CACHE_DIR"
