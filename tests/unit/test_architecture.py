"""The layers of the house, read from every module's imports (those inside functions too).

- The services (exporter, actuator, placer, gpusim) do not import each other; what two of
  them share lives in the shared layer below them. The one exception: the exporter's gpusim
  backend is gpusim's client.
- The shared layer (``gpuguard/*.py``, ``gpuguard/web/``) and the user's commands
  (``gpuguard/commands/``) import no service; only ``gpuguard/cli.py`` composes them all.
- The harness is a folder, ``gpuguard/demo/``: only ``gpuguard demo``'s command opens it,
  and nothing in gpuguard imports the tests (their support code lives in ``tests/support/``).
- The scripts beside the package import no tests either: ``bench/`` uses the harness (what
  it shares with the tests lives there), ``deploy/`` not even that (what its generators
  render comes from the shared layer).
- No import cycle between modules, not even one hidden by an import inside a function.
- The actuator's rooms (its sub-packages) import each other one way only, down
  ``ACTUATOR_ROOMS``: ``admission`` decides and imports no other room; and no room imports
  the modules that compose them (the controller, its handlers and drivers, the entry points).
- Importing a service's entry point loads no other service (``sys.modules`` of a fresh
  interpreter): the placer runs without the exporter's internals and without the simulator.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "gpuguard"
SERVICES = ("exporter", "actuator", "placer", "gpusim")
#: (importer, imported) pairs allowed across services
ALLOWED = {
    ("gpuguard.exporter.backends.gpusim", "gpuguard.gpusim.client"),
    ("gpuguard.exporter.backends.gpusim", "gpuguard.gpusim.errors"),
}
#: what composes the parts, or is the harness: may import any service
COMPOSERS = ("gpuguard.cli", "gpuguard.demo")
HARNESS = "gpuguard.demo"
#: the one door into the harness, opened only when ``gpuguard demo`` runs
HARNESS_DOOR = ("gpuguard.commands.demo", "gpuguard.demo.main")
#: the actuator's rooms, lowest first: each may import only rooms before it
ACTUATOR_ROOMS = ("admission", "engine", "safety", "execution", "nodemarks", "guard")
#: the actuator's composition (beside the rooms): no room imports it
ACTUATOR_COMPOSITION = tuple(
    f"gpuguard.actuator.{name}"
    for name in (
        "app", "cli", "controller", "http", "routing", "targets", "slo", "fastpath", "ratesteps",
    )
)  # fmt: skip
#: the folders of scripts outside the package, and what each may not import
SCRIPTS = {"bench": ("tests",), "deploy": ("tests", HARNESS)}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (the design folders through their links)."""
    found: dict[str, Path] = {}

    def walk(directory: Path, name: str) -> None:
        for path in sorted(directory.iterdir()):
            if path.is_dir() and (path / "__init__.py").is_file():
                walk(path, f"{name}.{path.name}")
            elif path.suffix == ".py":
                found[name if path.stem == "__init__" else f"{name}.{path.stem}"] = path

    walk(PACKAGE, "gpuguard")
    return found


MODULES = _modules()


def _known(name: str) -> str | None:
    """The module ``name`` is, or is inside of (an attribute of a module or package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, gpuguard module) for each import in the file, at any depth."""
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # ``from pkg import mod`` imports the module; ``from mod import name`` the module
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        known = {_known(t) for t in targets if t.startswith("gpuguard")}
        for target in sorted(k for k in known if k is not None and k != module):
            yield node.lineno, target


def _all_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of each absolute import, gpuguard's or not; ``from a
    import b`` gives ``a`` and ``a.b`` (``b`` may be a module)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)


GRAPH = {module: sorted({t for _, t in _imports(module, path)}) for module, path in MODULES.items()}


def _service(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in SERVICES else None


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_walk_sees_every_part() -> None:
    for part in (*SERVICES, "commands", "web"):
        assert f"gpuguard.{part}" in MODULES, part
    assert "gpuguard.exporter.backends.gpusim" in MODULES


def test_no_service_imports_another() -> None:
    offenders = [
        f"{module}:{line} imports {target}"
        for module, path in MODULES.items()
        if _service(module) is not None
        for line, target in _imports(module, path)
        if _service(target) not in (None, _service(module)) and (module, target) not in ALLOWED
    ]
    assert not offenders, "services import each other: " + "; ".join(offenders)


def test_services_do_not_import_the_commands_or_the_composition() -> None:
    offenders = [
        f"{module}:{line} imports {target}"
        for module, path in MODULES.items()
        if _service(module) is not None
        for line, target in _imports(module, path)
        if _within(target, ("gpuguard.commands", *COMPOSERS))
    ]
    assert not offenders, "; ".join(offenders)


def test_shared_layer_and_commands_import_no_service() -> None:
    offenders = [
        f"{module}:{line} imports {target}"
        for module, path in MODULES.items()
        if _service(module) is None and not _within(module, COMPOSERS)
        for line, target in _imports(module, path)
        if _service(target) is not None or _within(target, COMPOSERS)
        if (module, target) != HARNESS_DOOR
    ]
    assert not offenders, "; ".join(offenders)


def test_only_the_demo_command_opens_the_harness_and_nothing_imports_the_tests() -> None:
    offenders = [
        f"{module}:{line} imports {target}"
        for module, path in MODULES.items()
        if not _within(module, (HARNESS,))
        for line, target in _imports(module, path)
        if _within(target, (HARNESS,)) and (module, target) != HARNESS_DOOR
    ]
    offenders += [
        f"{module}:{line} imports tests"
        for module, path in MODULES.items()
        for line, name in _all_imports(path)
        if name == "tests" or name.startswith("tests.")
    ]
    assert not offenders, "; ".join(offenders)


def _actuator_room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["gpuguard", "actuator"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ACTUATOR_ROOMS else None


def test_every_actuator_package_is_a_room() -> None:
    packages = {
        m.split(".")[2]
        for m, path in MODULES.items()
        if m.startswith("gpuguard.actuator.") and path.stem == "__init__"
    }
    assert packages == set(ACTUATOR_ROOMS)


def test_the_actuators_rooms_import_one_way_and_never_the_composition() -> None:
    rank = {room: i for i, room in enumerate(ACTUATOR_ROOMS)}
    offenders = []
    for module, path in MODULES.items():
        room = _actuator_room(module)
        if room is None:
            continue
        for line, target in _imports(module, path):
            other = _actuator_room(target)
            if other is not None and other != room and rank[other] > rank[room]:
                offenders.append(f"{module}:{line} climbs to {target}")
            if _within(target, ACTUATOR_COMPOSITION):
                offenders.append(f"{module}:{line} imports the composition: {target}")
    assert not offenders, "; ".join(offenders)


def _forbidden(root: Path, paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    """``path:line imports name`` (from ``root``) for each import within ``forbidden``."""
    found: dict[tuple[str, int], str] = {}
    for path in paths:
        for line, name in _all_imports(path):
            where = (str(path.relative_to(root)), line)
            if _within(name, forbidden) and where not in found:  # ``a``, not also ``a.b``
                found[where] = name
    return [f"{path}:{line} imports {name}" for (path, line), name in sorted(found.items())]


def test_the_script_check_finds_an_import_inside_a_function(tmp_path: Path) -> None:
    script = tmp_path / "bench" / "x.py"
    script.parent.mkdir()
    script.write_text("def f():\n    from gpuguard import demo\n    import tests.support\n")
    assert _forbidden(tmp_path, [script], ("tests", HARNESS)) == [
        "bench/x.py:2 imports gpuguard.demo",
        "bench/x.py:3 imports tests.support",
    ]


@pytest.mark.parametrize("folder", sorted(SCRIPTS))
def test_scripts_beside_the_package_import_no_tests(folder: str) -> None:
    paths = sorted((REPO / folder).rglob("*.py"))
    assert paths, f"no scripts under {folder}/"
    offenders = _forbidden(REPO, paths, SCRIPTS[folder])
    assert not offenders, "; ".join(offenders)


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for child in edges:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, []))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_behind_a_function_level_import() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    ("entry", "others"),
    [
        ("gpuguard.placer.app", ("exporter", "gpusim", "actuator")),
        ("gpuguard.actuator.app", ("exporter", "gpusim", "placer")),
        ("gpuguard.actuator.guard.program", ("exporter", "gpusim", "placer")),
        ("gpuguard.exporter.app", ("actuator", "placer")),
        ("gpuguard.gpusim.daemon", ("exporter", "actuator", "placer")),
    ],
)
def test_a_service_loads_no_other(entry: str, others: tuple[str, ...]) -> None:
    prefixes = tuple(f"gpuguard.{part}" for part in others)
    code = (
        f"import sys, {entry}\n"
        f"print(','.join(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    assert out.stdout.strip() == "", f"{entry} loads {out.stdout.strip()}"
