"""``python -m batching prepare``: compile every feature's kernels ahead, once per install.

The engine compiles one version per feature combination on its first use (engine.first_use): 15-50 s each on 2 cores.
This command runs a small scenario of each feature the CLI and the dashboard offer (``FEATURES``), in ``--jobs``
processes, so later first uses load them from the kernel cache; a feature already compiled costs a fraction of a
second. The dashboard starts it in the background (``--background``: lowest CPU priority, quiet, one at a time per
kernel cache) once its first page's engine is ready.

``--ship`` builds the kernels the repository ships (kernel_cache): every feature compiled into an empty cache
directory, packed as ``batching/sim/kernels/<cache directory>.<platform tag>.tar.xz``. Run it after editing a kernel
source (a test says when the shipped archive no longer matches the sources).
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from batching.cli.args import add_policy_args, add_scenario_args, build_scenario, int_arg
from batching.sim.engine import first_use, kernel_cache

# (what it serves, run flags), each on 40 requests unless its flags say otherwise: every variant the pages and
# commands reach, the features alone first (the likeliest first uses), then the combinations (fleets and splits with
# speculation, sessions, caching). DeepSeek's MTP shares speculative decoding's variant today: listed so it stays so.
_SPLIT = ["--prefill-instances", "1", "--decode-instances", "1", "--prefill-tp", "4", "--decode-tp", "4"]
_FLEET = ["--nodes", "2", "--router", "least-kv"]
_PREFIX = ["--shared-prefix-tokens", "512", "--prefix-caching"]
FEATURES: tuple[tuple[str, list[str]], ...] = (
    ("the five batching policies", ["--preset", "priority"]),
    ("a router other than round-robin", _FLEET),
    ("speculative decoding", ["--spec-decode", "eagle"]),
    ("prefill/decode disaggregation", _SPLIT),
    ("prefix caching", _PREFIX),
    ("chat sessions", ["--workload", "chat-sessions"]),
    ("closed-loop clients", ["--concurrency", "4"]),
    # a Mooncake-scale trace names millions of KV blocks: past engine.state.DIRECT_IDS the prefix cache takes hashed
    # tables, another compile; 1,200 prompts of 60,000 tokens name 4.5 M blocks (about 1 s once compiled)
    ("prefix caching at trace scale (Mooncake)", ["--model", "llama-3.1-8b", "--num-gpus", "1", "--tp", "1",
                                                  "--prompt-tokens", "60000", "--output-tokens", "4", "--requests",
                                                  "1200", *_PREFIX]),
    ("speculative decoding with prefix caching", ["--spec-decode", "eagle", *_PREFIX]),
    ("speculative decoding with closed-loop clients", ["--spec-decode", "eagle", "--concurrency", "4"]),
    ("a routed fleet with prefix caching", [*_FLEET, *_PREFIX]),
    ("the prefix-affinity router", ["--nodes", "2", "--router", "prefix-affinity", *_PREFIX]),
    ("a routed fleet with speculative decoding", [*_FLEET, "--spec-decode", "eagle"]),
    ("a routed fleet with closed-loop clients", [*_FLEET, "--concurrency", "4"]),
    ("a routed fleet of chat sessions", [*_FLEET, "--workload", "chat-sessions"]),
    ("disaggregation with speculative decoding", [*_SPLIT, "--spec-decode", "eagle"]),
    ("disaggregation with prefix caching", [*_SPLIT, *_PREFIX]),
    ("disaggregation with closed-loop clients", [*_SPLIT, "--concurrency", "4"]),
    ("disaggregation of chat sessions", [*_SPLIT, "--workload", "chat-sessions"]),  # both roles' prefix caches
    ("DeepSeek-V3 with MTP", ["--model", "deepseek-v3", "--gpu", "h200-sxm", "--precision", "fp8",
                              "--spec-decode", "mtp"]),
)
REQUESTS = 40
HELPERS = "the cost model's parts the pages and calibrate call on their own"


def _cost_helpers() -> tuple[str, float]:
    """Compile the cost model's jitted functions that Python calls directly (Model and hardware's step breakdown and
    step times, the calibration's layer, all-reduce and MoE curves): each call from Python is a compile of its
    own, outside the engine's."""
    from batching.sim.hardware import calibration, costmodel as cm
    from batching.sim.hardware.specs import deployment

    start = time.perf_counter()
    costs = cm.cost_model(deployment())
    cm.step_breakdown(costs, 64, 0.0, 64 * 1400.0, 64)
    cm.step_time(costs, 64, 0.0, 64 * 1400.0, 64)
    cm.linear_layer_s(costs, 64)
    cm.elementwise_layer_s(costs, 64)
    cm.allreduce_s(costs, 1e6)
    calibration.allreduce_comparison()
    calibration.measured_kernel_rows()
    return HELPERS, time.perf_counter() - start


def add_parser(subparsers):
    p = subparsers.add_parser(
        "prepare", help="compile every feature's kernels ahead (once per install)",
        description="Compile the engine for every feature (routers, speculative decoding, disaggregation, prefix "
                    "caching, sessions, closed-loop clients, traces, and their combinations), so that no first use "
                    "waits for a compile. Features already compiled take a fraction of a second.")
    p.add_argument("--jobs", type=int_arg(1, 64), default=min(2, os.cpu_count() or 1),
                   help="processes compiling at once (default: 2, or 1 on a 1-CPU machine)")
    p.add_argument("--background", action="store_true",
                   help="lowest CPU priority, no output, and nothing if another prepare runs on this kernel cache "
                        "(the dashboard's)")
    p.add_argument("--ship", action="store_true",
                   help="compile every feature into an empty cache and pack it as the kernels the repository ships "
                        "(batching/sim/kernels/; after editing a kernel source)")
    p.set_defaults(func=cmd_prepare)
    return p


def _scenario(flags: list[str]):
    p = argparse.ArgumentParser()
    add_scenario_args(p)
    add_policy_args(p)
    return build_scenario(p.parse_args(["--requests", str(REQUESTS), *flags]))


def _run_one(label: str, flags: list[str]) -> tuple[str, float]:
    from batching.sim.simulate import simulate

    start = time.perf_counter()
    simulate(_scenario(flags))
    return label, time.perf_counter() - start


def _lock(path: Path) -> bool:
    """Hold ``path`` for this process unless a live process holds it."""
    try:
        pid = int(path.read_text().strip() or 0)
        if pid > 0 and pid != os.getpid():
            os.kill(pid, 0)
            return False
    except (OSError, ValueError):
        pass  # no file, unreadable, or its process has ended
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(os.getpid()))
    except OSError:
        return False
    return True


def _pack(src: Path, archive: Path) -> None:
    """``src``'s kernels and ready markers as a reproducible .tar.xz (sorted, no times or owners)."""
    files = sorted(f for f in src.rglob("*") if f.is_file() and not f.name.startswith((".", "compiling-", "prepare.")))
    tmp = archive.with_name(f".{archive.name}.{os.getpid()}")
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        for f in files:
            info = tarfile.TarInfo(f.relative_to(src).as_posix())
            info.size, info.mode = f.stat().st_size, 0o644
            with f.open("rb") as fh:
                tar.addfile(info, fh)
    os.replace(tmp, archive)


def ship(jobs: int) -> int:
    """Build the shipped kernels (module docstring); the archives of earlier sources go."""
    cpu = kernel_cache.portable_cpu()
    if cpu is None:
        print(f"this machine ({platform.machine()}) cannot build shipped kernels: they are built for "
              f"{', '.join(c for c, _ in kernel_cache.PORTABLE.values())}", file=sys.stderr)
        return 2
    target = kernel_cache.shipped_archive(cpu)
    name = kernel_cache.cache_dir().name
    with tempfile.TemporaryDirectory(prefix="batching-ship-") as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=tmp, BATCHING_SHIPPED_KERNELS="build")
        env.pop("NUMBA_CPU_NAME", None)
        env.pop("NUMBA_CPU_FEATURES", None)
        done = subprocess.run([sys.executable, "-m", "batching", "prepare", "--jobs", str(jobs)], env=env)
        if done.returncode:
            return done.returncode
        built = Path(tmp) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        _pack(built, target)
    for old in target.parent.glob("kernels-*.tar.xz"):
        if not old.name.startswith(name + "."):
            old.unlink()
    print(f"shipped kernels: {target} ({target.stat().st_size / 2**20:.1f} MiB)", file=sys.stderr)
    return 0


def cmd_prepare(args) -> int:
    if args.ship:
        return ship(args.jobs)
    quiet = args.background
    lock = Path(kernel_cache.active_dir()) / "prepare.pid"
    if args.background:
        try:
            os.nice(19)
        except OSError:
            pass
    if not _lock(lock):
        if not quiet:
            print(f"another prepare is compiling into {lock.parent} (pid {lock.read_text().strip()}); its "
                  "kernels are shared, so there is nothing to do here", file=sys.stderr)
        return 0
    first_use.set_default_listener(None)
    start = time.perf_counter()
    try:
        for _, flags in FEATURES:  # bad flags fail here, before any compile
            _scenario(flags)
        jobs = len(FEATURES) + 1
        if not quiet:
            print(f"compiling the engine for {len(FEATURES)} features and {HELPERS}, in {args.jobs} processes, "
                  f"into {kernel_cache.active_dir()} (once per install; 15-50 s a feature on one core)",
                  file=sys.stderr)
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(_run_one, label, flags) for label, flags in FEATURES]
            futures.append(pool.submit(_cost_helpers))
            for done, fut in enumerate(futures, 1):
                label, took = fut.result()
                if not quiet:
                    print(f"[{done}/{jobs}] {label}: ready ({took:.1f} s)", file=sys.stderr)
    finally:
        try:
            lock.unlink()
        except OSError:
            pass
    if not quiet:
        print(f"every feature is compiled ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return 0
