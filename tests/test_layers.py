"""The layers of the package import only downward, without cycles, and Streamlit stays in the dashboard.

Every module's imports are read from its syntax tree (module level and inside functions alike):

    batching.sim  ->  batching.studies  ->  batching.charts, batching.report  ->  batching.cli, batching.ui  ->  app.py, pages/

A module imports its own layer or a lower one; cli and ui, the two front ends, do not import each other;
no module outside batching/ui/, app.py and pages/ imports Streamlit, directly or through another module; and
no group of modules imports itself round (a cycle, function-level imports included). The checker runs on
the tree and on copies with a violation planted, so a broken checker cannot pass silently.
"""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# (module prefix, layer), lowest first; the package root only configures the kernel cache (sim's)
LAYERS: tuple[tuple[str, int], ...] = (
    ("batching.sim", 0), ("batching.data", 0),
    ("batching.studies", 1),
    ("batching.charts", 2), ("batching.report", 2),
    ("batching.cli", 3), ("batching.__main__", 3), ("batching.ui", 3),
    ("app", 4), ("pages", 4),
)
ROOT_PACKAGE = ("batching", 0)
APART = (("batching.cli", "batching.ui"), ("batching.__main__", "batching.ui"))  # front ends on one floor
STREAMLIT_ALLOWED = ("batching.ui", "app", "pages")
# floors inside batching.sim: what a request stream is and what a step costs know nothing of the engine; one
# engine knows nothing of many (topology); none of them knows the entry that ties them together (simulate)
SIM_FLOORS: tuple[tuple[str, int], ...] = (
    ("batching.sim.hardware", 0), ("batching.sim.workload", 0),
    ("batching.sim.engine", 1), ("batching.sim.topology", 2), ("batching.sim.simulate", 3),
)


def sim_floor(name: str) -> int | None:
    for prefix, level in SIM_FLOORS:
        if _within(name, prefix):
            return level
    return None


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for the package, app.py and the pages."""
    found = {}
    for path in sorted((root / "batching").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    if (root / "app.py").exists():
        found["app"] = root / "app.py"
    for path in sorted((root / "pages").glob("*.py")):
        found[f"pages.{path.stem}"] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(module imported, line) for every import in the file, at any depth; ``from pkg import sub`` names the
    submodule when there is one."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = name.split(".") if is_package else name.split(".")[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub if sub in known else base, node.lineno))
    return out


def layer(name: str) -> int | None:
    for prefix, level in LAYERS:
        if _within(name, prefix):
            return level
    return ROOT_PACKAGE[1] if name == ROOT_PACKAGE[0] else None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def problems(root: Path) -> list[str]:
    """Every upward or sideways import, Streamlit outside the dashboard, and every import cycle."""
    mods = modules(root)
    known = set(mods)
    out: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in mods}
    direct_streamlit: set[str] = set()
    for name, path in mods.items():
        src = layer(name)
        if src is None:
            out.append(f"{name}: in no layer; add it to tests/test_layers.py LAYERS")
            continue
        where = path.relative_to(root)
        for target, line in imports(name, path, known):
            if _within(target, "streamlit"):
                direct_streamlit.add(name)
                if not any(_within(name, p) for p in STREAMLIT_ALLOWED):
                    out.append(f"{where}:{line}: {name} imports Streamlit (allowed only in batching/ui/, app.py, "
                               "pages/)")
                continue
            if not (_within(target, "batching") or target == "app" or _within(target, "pages")):
                continue  # the standard library and third-party packages
            if target in known and target != name:
                graph[name].add(target)
            dst = layer(target)
            if dst is not None and dst > src:
                out.append(f"{where}:{line}: {name} (layer {src}) imports {target} (layer {dst}): upward")
            f_src, f_dst = sim_floor(name), sim_floor(target)
            if f_src is not None and f_dst is not None and f_dst > f_src:
                out.append(f"{where}:{line}: {name} (sim floor {f_src}) imports {target} (sim floor {f_dst}): upward")
            for a, b in APART:
                if (_within(name, a) and _within(target, b)) or (_within(name, b) and _within(target, a)):
                    out.append(f"{where}:{line}: {name} imports {target}: the CLI and the dashboard stay apart")
    # Streamlit reached through another module
    for name in mods:
        if any(_within(name, p) for p in STREAMLIT_ALLOWED) or name in direct_streamlit:
            continue
        seen, todo = {name}, [name]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        via = sorted(seen & direct_streamlit)
        if via:
            out.append(f"{name} reaches Streamlit through {', '.join(via)}")
    for comp in _cycles(graph):
        out.append(f"import cycle: {' -> '.join(comp)}")
    return out


def test_the_tree_imports_only_downward_without_cycles():
    assert problems(ROOT) == []


def test_every_module_is_seen_and_has_a_layer():
    mods = modules(ROOT)
    for name in ("batching.sim.engine.kernel", "batching.studies.planning", "batching.charts.planning", "batching.report",
                 "batching.ui.planning", "batching.ui.nav", "app", "pages.tune", "pages.capacity"):
        assert name in mods
    assert all(layer(m) is not None for m in mods)
    # function-level imports are read too: cmd_sweep's and the capacity study's own
    known = set(mods)
    found = {t for t, _ in imports("batching.studies.capacity", mods["batching.studies.capacity"], known)}
    assert "batching.sim.metrics" in found  # imported inside slo_point()


# ---------------------------------------------------------------- the checker catches what it should


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package, app.py and the pages to plant violations in."""
    shutil.copytree(ROOT / "batching", tmp_path / "batching", ignore=shutil.ignore_patterns("__pycache__", "data"))
    (tmp_path / "batching" / "data").mkdir()
    (tmp_path / "batching" / "data" / "__init__.py").write_text("")
    shutil.copytree(ROOT / "pages", tmp_path / "pages", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "app.py", tmp_path / "app.py")
    assert problems(tmp_path) == problems(ROOT)  # the copy reads as the tree does
    return tmp_path


def plant(root: Path, rel: str, code: str) -> list[str]:
    """Append ``code`` to a file of the copy; the problems that brings (the tree's own left out)."""
    before = set(problems(root))
    path = root / rel
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + code + "\n", encoding="utf-8")
    return [p for p in problems(root) if p not in before]


def test_a_planted_upward_import_fails(tree: Path):
    found = plant(tree, "batching/sim/metrics.py", "def _planted():\n    from batching.ui import cache\n    return cache")
    assert any("batching.sim.metrics (layer 0) imports batching.ui.cache (layer 3): upward" in p for p in found), found
    # through Streamlit too: sim now reaches it by way of the dashboard's cache
    assert any(p.startswith("batching.sim.metrics reaches Streamlit through batching.ui.cache") for p in found)


def test_a_planted_import_up_the_sim_floors_fails(tree: Path):
    found = plant(tree, "batching/sim/engine/stages.py", "def _planted():\n    from batching.sim.topology import fleet\n"
                                                          "    return fleet")
    assert any("batching.sim.engine.stages (sim floor 1) imports batching.sim.topology.fleet (sim floor 2): upward" in p
               for p in found), found
    found = plant(tree, "batching/sim/workload/traces.py", "from batching.sim import simulate")
    assert any("batching.sim.workload.traces (sim floor 0) imports batching.sim.simulate (sim floor 3)" in p
               for p in found), found


def test_a_planted_relative_upward_import_fails(tree: Path):
    found = plant(tree, "batching/studies/knee.py", "def _planted():\n    from ..charts import planning\n"
                                                    "    return planning")
    assert any("batching.studies.knee (layer 1) imports batching.charts.planning (layer 2): upward" in p
               for p in found), found


def test_a_planted_cycle_fails(tree: Path):
    # studies.planning imports studies.knee; a lazy import back closes the loop
    found = plant(tree, "batching/studies/knee.py", "def _planted():\n    from batching.studies import planning\n"
                                                    "    return planning")
    assert found == ["import cycle: batching.studies.knee -> batching.studies.planning"], found
    assert not any("upward" in p for p in found)


def test_streamlit_outside_the_dashboard_fails(tree: Path):
    found = plant(tree, "batching/charts/planning.py", "def _planted():\n    import streamlit as st\n    return st")
    assert any("batching.charts.planning imports Streamlit" in p for p in found), found
    # one level down, through a module that imports it: the report (and the CLI on top of it) reach Streamlit
    found = plant(tree, "batching/charts/policy.py", "def _planted():\n    import streamlit\n    return streamlit")
    assert any(p.startswith("batching.report reaches Streamlit through ") and p.endswith("batching.charts.policy")
               for p in found), found


def test_the_cli_and_the_dashboard_stay_apart(tree: Path):
    found = plant(tree, "batching/cli/report.py", "def _planted():\n    from batching.ui import params\n"
                                                   "    return params")
    assert any("batching.cli.report imports batching.ui.params: the CLI and the dashboard stay apart" in p
               for p in found), found
