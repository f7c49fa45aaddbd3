"""Import layering: lower layers never import upper ones.

`streamd.model` (the network, its checkpoint loader, feature front end and tokenizer) is the
bottom: it imports nothing from `streamd.audio` (live features, PCM intake) or `streamd.decoding`
(search). The clients speak only the wire protocol: nothing of the server, engine or model. A stream
session (`streamd.session`) does no I/O: no sockets, tasks or threads, nothing of the server. The
session and a front-end process (the connections, their protocol faces) load no torch: what they
know of the engine is in `streamd.engine.types`.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "streamd"


def imported_modules(source: str, package: str, typing_only: bool = True) -> list[tuple[int, str]]:
    """(line, module) of every import in a module's source, at any depth (function-level imports
    included, and TYPE_CHECKING ones unless `typing_only` is False); relative imports are
    resolved against `package`."""
    out: list[tuple[int, str]] = []
    tree = ast.parse(source)
    if not typing_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            # `from streamd import audio` imports a package too
            out += [(node.lineno, module)] + [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return out


def violations(layer: str, forbidden: tuple[str, ...]) -> dict[str, str]:
    """file:line -> the forbidden module imported there, for every module of `layer`."""
    found: dict[str, str] = {}
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
        for line, module in imported_modules(path.read_text(), package):
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if any(module == f or module.startswith(f + ".") for f in forbidden) and where not in found:
                found[where] = module
    return found


@pytest.mark.parametrize(("layer", "forbidden"), [
    ("model", ("streamd.audio", "streamd.decoding", "streamd.engine", "streamd.server", "streamd.clients")),
    ("clients", ("streamd.server", "streamd.engine", "streamd.model", "streamd.decoding", "torch")),
    ("session", ("streamd.server", "streamd.clients", "websockets", "asyncio", "threading", "socket", "torch")),
])
def test_no_upward_imports(layer: str, forbidden: tuple[str, ...]) -> None:
    assert violations(layer, forbidden) == {}


# What a front-end process imports (server/worker.py) and the session layer: none may load torch.
TORCH_FREE = ("streamd.engine.types", "streamd.session.core", "streamd.server.context", "streamd.server.handler",
              "streamd.server.native", "streamd.server.realtime", "streamd.server.deepgram", "streamd.server.front",
              "streamd.server.link", "streamd.server.worker", "streamd.session.realtime")


@pytest.mark.parametrize("module", TORCH_FREE)
def test_loads_no_torch(module: str) -> None:
    """Importing the module (and everything it imports) leaves torch unloaded."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", f"importing {module} loads torch"


def import_cycles() -> list[list[str]]:
    """The sets of streamd modules that import each other at run time (TYPE_CHECKING imports do
    not count), each sorted; strongly connected components of the import graph."""
    modules: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = imported_modules(path.read_text(), package, typing_only=False)
        graph[name] = {m for _, m in found if m in modules and m != name}
    reach = {name: set() for name in graph}  # modules reachable from each (a few hundred: plain search)
    for name in graph:
        todo = list(graph[name])
        while todo:
            m = todo.pop()
            if m not in reach[name]:
                reach[name].add(m)
                todo += graph[m]
    cycles = {tuple(sorted({name} | {m for m in reach[name] if name in reach[m]})) for name in graph if name in reach[name]}
    return sorted(list(c) for c in cycles)


def test_no_import_cycles() -> None:
    assert import_cycles() == []


def test_the_check_sees_imports() -> None:
    """The walker finds plain, from-, relative, nested and TYPE_CHECKING imports."""
    source = ("import streamd.audio.pcm\nfrom ..decoding import greedy\nfrom streamd import audio\n"
              "if TYPE_CHECKING:\n    from streamd.server import app\n"
              "def f():\n    from streamd.decoding.state import DecoderState\n")
    found = {m for _, m in imported_modules(source, "streamd.model")}
    assert {"streamd.audio.pcm", "streamd.decoding.greedy", "streamd.audio", "streamd.server.app",
            "streamd.decoding.state"} <= found
