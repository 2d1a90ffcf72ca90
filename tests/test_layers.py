"""The app's import graph: no module imports itself back through others, and imports sit at the
top of their module (a function-level import hides a dependency, usually a cycle), except where
Django requires one. The layer contracts themselves are import-linter's ([tool.importlinter])."""

import ast
from pathlib import Path

import grimp
import networkx as nx

APP = Path(__file__).resolve().parent.parent / "convoys"
# Django: AppConfig.ready() is the one place that may import what needs the model registry.
ALLOWED_LOCAL_IMPORTS = {("apps.py", "ready")}


def test_no_import_cycle_between_modules():
    imports = grimp.build_graph("convoys")  # function-level imports included
    graph = nx.DiGraph(
        (module, imported)
        for module in imports.modules
        for imported in imports.find_modules_directly_imported_by(module)
    )
    cycles = sorted(nx.simple_cycles(graph), key=len)
    assert cycles == [], f"import cycles: {cycles[:5]}"


def local_imports():
    """(file, function, line) of every import inside a function of the app."""
    for path in sorted(APP.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        yield str(path.relative_to(APP)), node.name, inner.lineno


def test_imports_sit_at_the_top_of_their_module():
    found = [item for item in local_imports() if item[:2] not in ALLOWED_LOCAL_IMPORTS]
    assert found == [], f"function-level imports (file, function, line): {found}"
    # The checker sees the one allowed import (else it could not fail).
    assert ("apps.py", "ready") in {item[:2] for item in local_imports()}
