import ast
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
    """Each module with jitted code, and the engine's constants (engine/state.py: numba freezes them
    into the compiled code), keys the cache: an edit to any of them must not be served stale."""
    sim = ROOT / "batching" / "sim"
    jitted = {p.relative_to(sim).as_posix() for p in sim.rglob("*.py") if "@njit" in p.read_text()}
    assert {"hardware/costmodel.py", "engine/kernel.py", "engine/stages.py"} <= jitted
    assert jitted | {"engine/state.py"} <= set(kernel_cache.KERNEL_SOURCES)
    pkg = _copy_sources(tmp_path / "sim")
    before = kernel_cache.sources_digest(pkg)
    for name in ("engine/state.py", "engine/stages.py", "hardware/specs.py"):
        text = (pkg / name).read_text()
        (pkg / name).write_text(text + "\n# edited\n")
        assert kernel_cache.sources_digest(pkg) != before
        (pkg / name).write_text(text)
    assert kernel_cache.sources_digest(pkg) == before


def _jitted(dec) -> bool:
    f = dec.func if isinstance(dec, ast.Call) else dec
    return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) in ("njit", "jit")


def _local_names(fn: ast.FunctionDef) -> set[str]:
    args = fn.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    return names | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def compiled_in(sim: Path) -> set[str]:
    """The files of batching/sim whose source the kernels compile in: every module with a jitted function, and
    every module that defines something jitted code reads (a function it calls, a class it builds, a constant
    Numba freezes into the compiled code, or what such a constant is computed from), followed through the
    imports (``from batching.sim.x import name``, ``from batching.sim import x as alias``)."""
    modules = {}
    for path in sim.rglob("*.py"):
        imports, defs, jitted = {}, {}, []
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[:2] == ["batching", "sim"]:
                package = "/".join(node.module.split(".")[2:])  # "" or "engine" or "engine/state"
                for a in node.names:
                    sub = f"{package}/{a.name}" if package else a.name
                    if (sim / f"{sub}.py").exists():  # from batching.sim[.pkg] import module [as alias]
                        imports[a.asname or a.name] = (sub, None)
                    else:  # from batching.sim.pkg.module import name
                        imports[a.asname or a.name] = (package, a.name)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defs[node.name] = node
                if isinstance(node, ast.FunctionDef) and any(_jitted(d) for d in node.decorator_list):
                    jitted.append(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defs.update({n.id: node.value for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)})
        modules[path.relative_to(sim).with_suffix("").as_posix()] = (imports, defs, jitted)
    todo = [(m, f) for m, (_, _, jitted) in modules.items() for f in jitted]
    seen, found = set(), set()
    while todo:
        m, name = todo.pop()
        if (m, name) in seen or m not in modules:
            continue
        seen.add((m, name))
        imports, defs, _ = modules[m]
        if name in imports:
            target, obj = imports[name]
            if obj is not None:
                todo.append((target, obj))
            continue
        if name not in defs:
            continue  # a builtin, NumPy, Numba
        found.add(f"{m}.py")
        node = defs[name]
        local = _local_names(node) if isinstance(node, ast.FunctionDef) else set()
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and imports.get(n.value.id, ("", ""))[1] \
                    is None:
                todo.append((imports[n.value.id][0], n.attr))
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local:
                todo.append((m, n.id))
    return found


def test_every_module_the_kernels_compile_in_keys_the_cache():
    """Numba freezes module constants into the compiled code (engine/stages.py reads hardware/specs.py's KV_BLOCK_TOKENS) and
    checks only the file of the function it caches: every module the kernels read, as their imports give it,
    must be hashed, or an edit to it is served stale."""
    sim = ROOT / "batching" / "sim"
    found = compiled_in(sim)
    assert {"engine/kernel.py", "engine/stages.py", "engine/state.py", "hardware/costmodel.py", "hardware/specs.py"} <= found
    assert found <= set(kernel_cache.KERNEL_SOURCES), sorted(found - set(kernel_cache.KERNEL_SOURCES))


def test_numba_cache_dir_is_honoured(tmp_path):
    """Without the shipped kernels (another platform, or BATCHING_SHIPPED_KERNELS=off) the engine compiles into
    NUMBA_CACHE_DIR."""
    code = ("from batching.sim.simulate import Scenario, simulate; from batching.sim.workload.requests import workload_preset;"
            "import numba; print(numba.config.CACHE_DIR);"
            "simulate(Scenario(workload=workload_preset('chat', 2.0, 20, 0)))")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), BATCHING_SHIPPED_KERNELS="off")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=600).stdout.strip()
    assert Path(out).parent == tmp_path and Path(out).name.startswith("kernels-")
    assert list(tmp_path.rglob("*kernel*.nbi")), "the engine kernel was not cached in NUMBA_CACHE_DIR"
    assert not list(tmp_path.glob("*/shipped-*")), "the shipped kernels were unpacked although turned off"


def test_the_cache_is_filed_by_place_in_the_package_not_on_disk(tmp_path):
    """Numba's own locator names a function's folder by a hash of its absolute path: a clone elsewhere would miss."""
    here = kernel_cache.PackageLocator.get_suitable_cache_subpath(str(kernel_cache.SIM_DIR / "engine" / "kernel.py"))
    assert here == "sim-engine"
    assert kernel_cache.PackageLocator.get_suitable_cache_subpath(
        str(kernel_cache.SIM_DIR / "hardware" / "costmodel.py")) == "sim-hardware"
    outside = kernel_cache.PackageLocator.get_suitable_cache_subpath(str(tmp_path / "engine" / "kernel.py"))
    assert outside != here and outside.startswith("engine_")  # not this package's: Numba's own name


def test_the_shipped_kernels_match_the_sources():
    """The repository ships its compiled kernels (issue 25: a fresh clone loads them instead of compiling them); an
    edit to a kernel source without ``prepare --ship`` would ship kernels nothing loads."""
    names = sorted(a.name for a in kernel_cache.SHIPPED_DIR.glob("kernels-*.tar.xz"))
    want = kernel_cache.cache_dir().name + "."
    assert names, "batching/sim/kernels/ ships no compiled kernels: run `python -m batching prepare --ship`"
    assert all(n.startswith(want) for n in names), (
        f"batching/sim/kernels/ holds {names}, compiled from other kernel sources than these ({want}*): run "
        "`python -m batching prepare --ship`")
    for cpu, _ in kernel_cache.PORTABLE.values():
        assert any(n.endswith(f"-{cpu}.tar.xz") for n in names), f"no kernels shipped for {cpu}"


FEATURES_FROM_SHIPPED = r"""
import json
from pathlib import Path
from numba.core import config
from batching.cli import prepare
from batching.sim.engine import first_use, kernel_cache
cache = kernel_cache.active_dir()
before = {p.relative_to(cache) for p in cache.rglob("*.nbc")}
said = []
first_use.set_default_listener(lambda event, v: said.append(event + ": " + (v.label or "the engine")))
for label, flags in prepare.FEATURES:
    prepare._run_one(label, flags)
prepare._cost_helpers()
from streamlit.testing.v1 import AppTest
page = AppTest.from_file("app.py", default_timeout=300)
page.switch_page("pages/model_and_hardware.py")
page.run()
assert not page.exception, page.exception
new = sorted(str(p.relative_to(cache)) for p in cache.rglob("*.nbc") if p.relative_to(cache) not in before)
print(json.dumps({"cpu": config.CPU_NAME, "unpacked": len(before), "compiled": new, "said": said,
                  "shipped": [p.name for p in cache.glob("shipped-*")]}))
"""


def test_a_fresh_clone_elsewhere_loads_every_feature_from_the_shipped_kernels(tmp_path):
    """A copy of the package at another path with an empty kernel cache: the first import unpacks the shipped
    kernels, and every feature ``prepare`` lists (each variant the pages and commands reach), the cost model's parts
    the pages call, and the Model and hardware page (which calls them) run without a compile and without the
    compile notice."""
    cpu = kernel_cache.portable_cpu()
    if cpu is None or not kernel_cache.shipped_archive(cpu).exists():
        import pytest

        pytest.skip(f"no kernels shipped for this machine ({kernel_cache.platform_tag(cpu or 'host CPU')})")
    clone = tmp_path / "clone"
    for part in ("batching", "pages", "app.py", "data", "static", "assets", ".streamlit"):
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, clone / part, ignore=shutil.ignore_patterns("__pycache__"))
        elif (ROOT / part).exists():
            shutil.copy(ROOT / part, clone / part)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("BATCHING_SHIPPED_KERNELS", None)
    env.pop("NUMBA_CPU_NAME", None)
    done = subprocess.run([sys.executable, "-c", FEATURES_FROM_SHIPPED], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    got = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert got["cpu"] == cpu and got["shipped"] and got["unpacked"] > 0
    assert got["compiled"] == [] and got["said"] == [], got


def _no_writable_cache(monkeypatch, tmp_path):
    """Neither the package's __pycache__ nor the user's cache folder can be written: cache_dir's last resort."""
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(kernel_cache, "_writable", lambda path: False)
    monkeypatch.setattr(kernel_cache.tempfile, "tempdir", str(tmp_path))


def test_the_last_resort_cache_is_private_to_the_user(monkeypatch, tmp_path):
    """issue 39 item 16: not a shared /tmp/batching-explorer/<digest> that another local user could seed with
    pickled code, but a folder of the user's own, created 0700."""
    _no_writable_cache(monkeypatch, tmp_path)
    path = kernel_cache.cache_dir()
    assert path.parent != tmp_path / "batching-explorer", "the shared folder of every user"
    assert path.parent == tmp_path / f"batching-explorer-{os.getuid()}"
    st = path.parent.lstat()
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
    assert kernel_cache.cache_dir() == path, "the same folder for the next process: its kernels are reused"


def test_a_last_resort_folder_others_can_write_in_is_skipped(monkeypatch, tmp_path):
    _no_writable_cache(monkeypatch, tmp_path)
    seeded = tmp_path / f"batching-explorer-{os.getuid()}"
    seeded.mkdir()
    seeded.chmod(0o777)  # anyone could have put a pickled kernel in it
    path = kernel_cache.cache_dir()
    assert seeded not in path.parents
    assert path.parent.parent == tmp_path and kernel_cache.is_private(path.parent)
    assert path.parent.lstat().st_mode & 0o777 == 0o700


def test_a_last_resort_symlink_or_another_users_folder_is_skipped(monkeypatch, tmp_path):
    _no_writable_cache(monkeypatch, tmp_path)
    name = tmp_path / f"batching-explorer-{os.getuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    name.symlink_to(elsewhere)
    assert not kernel_cache.is_private(name)
    path = kernel_cache.cache_dir()
    assert name not in path.parents and elsewhere not in path.parents
    if os.getuid() == 0:  # only root can give a folder to another user
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        os.chown(other, 54321, 54321)
        assert not kernel_cache.is_private(other)
