"""Where Numba keeps the compiled kernels, keyed by the kernel sources.

Numba checks only the file of the function it caches: the engine's cached code inlines the
cost model, so an edited hardware/costmodel.py would be served stale. The cache therefore lives in a
directory named after a hash of every module with jitted code and of the modules whose constants
Numba freezes into it (engine/state.py; hardware/specs.py, whose KV_BLOCK_TOKENS the engine divides
by); ``NUMBA_CACHE_DIR`` (for a read-only install or a hosted server) chooses its parent.

A cache built on one machine serves another: kernel_cache files each compile by its place inside the package (Numba's
own locator names the folder by a hash of its absolute path) and Numba checks each entry against its source's
content. The repository ships one, ``kernels/<cache directory>.<platform tag>.tar.xz``, built by
``python -m batching prepare --ship`` for a CPU level most machines of the platform have (``PORTABLE``: x86-64-v3 on
x86-64); on a matching machine the kernels compile for that level (a cache is keyed by the CPU it was built for)
and the archive is unpacked into an empty cache directory on the first import, so a fresh clone loads its kernels
instead of compiling them (issue 25: 25 s of compile on 2 cores). Elsewhere, or with
``BATCHING_SHIPPED_KERNELS=off``, or with ``NUMBA_CPU_NAME`` set, Numba compiles for the host CPU as before.
"""
from __future__ import annotations

import hashlib
import os
import platform
import stat
import sys
import tarfile
import tempfile
from pathlib import Path

from numba.core import caching

SIM_DIR = Path(__file__).resolve().parents[1]  # batching/sim/
# every module whose code or constants the kernels compile in, relative to batching/sim/
KERNEL_SOURCES = ("hardware/costmodel.py", "hardware/specs.py", "engine/state.py", "engine/stages.py", "engine/kernel.py",
                  "topology/fleet.py", "topology/disagg.py")


SHIPPED_DIR = SIM_DIR / "kernels"
# what else a cache directory's kernels depend on: its layout (a change of it orphans the old directories)
LAYOUT = b"layout 2: filed by place in the package"
# the CPU level shipped kernels are compiled for, per machine, and the features (LLVM's names) a host needs to run
# them: x86-64-v3 is AVX2, FMA and BMI2 (Intel since Haswell, 2013; AMD since Excavator, 2015). Measured against
# the host's own code on a Zen 4 (benchmarks/bench_engine_pair.py): generic x86-64 ran speculative decoding's kernel
# 15 % slower; x86-64-v3 ran every case within 4 %.
PORTABLE = {"x86_64": ("x86-64-v3", ("avx", "avx2", "bmi", "bmi2", "cx16", "f16c", "fma", "lzcnt", "movbe",
                                     "popcnt", "sahf", "sse4.1", "sse4.2", "ssse3", "xsave"))}


def sources_digest(package_dir: Path = SIM_DIR) -> str:
    h = hashlib.sha256(LAYOUT)
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
    directory when the package is read-only, or a private folder of the temporary directory (``private_temp_dir``)
    when that cannot be written either."""
    digest = f"kernels-{sources_digest()}"
    user = os.environ.get("NUMBA_CACHE_DIR")
    if user:
        return Path(user) / digest
    local = SIM_DIR / "__pycache__" / digest
    if _writable(local):
        return local
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    fallback = base / "batching-explorer" / digest
    return fallback if _writable(fallback) else private_temp_dir() / digest


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def is_private(path: Path) -> bool:
    """Whether ``path`` is a real folder (not a symlink) owned by the current user that no one else can write in.
    Numba's cache holds pickled objects that are loaded back, so a folder another local user could write in (or
    had created first) could feed this process code."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o022:
        return False
    return _uid() is None or st.st_uid == _uid()


def private_temp_dir() -> Path:
    """The last resort when neither the package nor the user's cache folder can be written: a folder of the
    temporary directory that only the current user owns and can write in, ``batching-explorer-<uid>`` (created
    0700). When that name is taken by a folder that is not private (``is_private``: another user's, a symlink,
    writable by others), it is left alone and a fresh private folder is made for this process (mkdtemp: 0700),
    so the kernels compile again rather than load from a folder someone else could have seeded."""
    tmp = Path(tempfile.gettempdir())
    uid = _uid()
    shared = tmp / f"batching-explorer-{uid if uid is not None else 'user'}"
    try:
        shared.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return Path(tempfile.mkdtemp(prefix="batching-explorer-", dir=tmp))
    if is_private(shared):
        return shared
    return Path(tempfile.mkdtemp(prefix=f"{shared.name}-", dir=tmp))


class PackageLocator(caching.UserProvidedCacheLocator):
    """Numba's locator for a chosen cache directory, filing each function under its source's folder relative to
    batching/sim/ (Numba's own names the folder by a hash of its absolute path), so that a cache built in one clone
    serves another: Numba checks each entry against its source's content, not its place."""

    @classmethod
    def get_suitable_cache_subpath(cls, py_file):
        try:
            return "sim-" + "-".join(Path(py_file).resolve().parent.relative_to(SIM_DIR).parts)
        except ValueError:  # not a kernel of this package
            return super().get_suitable_cache_subpath(py_file)


def portable_cpu() -> str | None:
    """The shipped kernels' CPU level if this machine runs it (``PORTABLE``), else None."""
    entry = PORTABLE.get(platform.machine().lower())
    if entry is None:
        return None
    from llvmlite import binding

    have = binding.get_host_cpu_features()
    return entry[0] if all(have.get(f, False) for f in entry[1]) else None


def platform_tag(cpu: str) -> str:
    """What a compiled kernel is bound to besides its sources: the Python (Numba files each compile under its
    cache tag), Numba's version (its index refuses another's), llvmlite's (the code generator; Numba does not
    check it), the platform and the CPU level."""
    import llvmlite
    import numba

    return (f"{sys.implementation.cache_tag}-numba{numba.__version__}-llvmlite{llvmlite.__version__}-{sys.platform}"
            f"-{cpu}")


def shipped_archive(cpu: str, path: Path | None = None) -> Path:
    """The shipped archive that would serve cache directory ``path`` (``cache_dir()``'s) compiled for ``cpu``."""
    return SHIPPED_DIR / f"{(path or cache_dir()).name}.{platform_tag(cpu)}.tar.xz"


def unpack_shipped(path: Path, cpu: str) -> None:
    """Unpack the shipped kernels into ``path`` once. Each file is written beside
    its place and renamed into it, so two processes starting at once write the same files whole; the marker goes
    last. A read-only directory or a damaged archive leaves the kernels to compile, as without one."""
    marker = path / f"shipped-{platform_tag(cpu)}"
    archive = shipped_archive(cpu, path)
    if marker.exists() or not archive.exists() or not _writable(path):
        return
    try:
        with tarfile.open(archive, "r:xz") as tar:
            for member in tar:
                if not member.isfile() or Path(member.name).is_absolute() or ".." in Path(member.name).parts:
                    continue
                data = tar.extractfile(member).read()
                target = path / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.{os.getpid()}")
                tmp.write_bytes(data)
                os.replace(tmp, target)
        marker.write_text(archive.name)
    except (OSError, tarfile.TarError, EOFError):
        pass


def shipped_here() -> bool:
    """Whether the active cache directory holds the shipped kernels (every feature ``prepare`` lists)."""
    return any(active_dir().glob("shipped-*"))


_ACTIVE: list[Path] = []


def configure() -> Path:
    """Point Numba's cache at ``cache_dir()``; call before any jitted module is imported."""
    from numba import config

    path = cache_dir()
    config.CACHE_DIR = str(path)
    config.CACHE_LOCATOR_CLASSES = f"{__name__}.PackageLocator"
    mode = os.environ.get("BATCHING_SHIPPED_KERNELS", "on")  # on | off | build (prepare --ship's compile)
    cpu = portable_cpu() if config.CPU_NAME is None and mode != "off" else None
    if cpu is not None and (mode == "build" or shipped_archive(cpu, path).exists()):
        config.CPU_NAME, config.CPU_FEATURES = cpu, ""
        if mode != "build":
            unpack_shipped(path, cpu)
    _ACTIVE[:] = [path]
    return path


def active_dir() -> Path:
    """The directory Numba caches into (``configure``'s), where first_use keeps its markers."""
    return _ACTIVE[0] if _ACTIVE else cache_dir()
