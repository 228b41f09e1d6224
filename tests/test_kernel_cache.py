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
    code = ("from batching.sim.simulate import Scenario, simulate; from batching.sim.workload.requests import workload_preset;"
            "import numba; print(numba.config.CACHE_DIR);"
            "simulate(Scenario(workload=workload_preset('chat', 2.0, 20, 0)))")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=600).stdout.strip()
    assert Path(out).parent == tmp_path and Path(out).name.startswith("kernels-")
    assert list(tmp_path.rglob("*kernel*.nbi")), "the engine kernel was not cached in NUMBA_CACHE_DIR"
