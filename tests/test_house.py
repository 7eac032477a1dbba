"""The house rules a reader relies on, checked over the source as text (pure AST, no imports).

An import inside a function body is allowed only where something must load late (the CLI's ``--help`` that
loads no service, a task's service that loads when it runs, a benchmark's measured child process), and says
why: a ``# lazy: why`` comment on its line or on the comment line right above it. Anything else is imported
at the top of its module, so a module's dependencies read from its head and ``lint-imports`` sees them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHECKED = ("fleetscope", "ingest", "analyzers", "governance", "dashboard", "benchmarks")


def unmarked_local_imports(source: str) -> list[int]:
    """Line numbers of the imports inside function bodies that carry no ``# lazy:`` comment."""
    lines = source.splitlines()
    found: set[int] = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            here = lines[node.lineno - 1]
            above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
            if "# lazy:" not in here and not (above.startswith("#") and "# lazy:" in above):
                found.add(node.lineno)
    return sorted(found)


def test_the_rule_sees_a_local_import_and_its_reason():
    src = (
        "import os\n"
        "def f():\n"
        "    import json\n"
        "    from a import b  # lazy: b loads its plugins\n"
        "    # lazy: c is heavy\n"
        "    import c\n"
        "    def g():\n"
        "        import d\n"
        "    x = 1  # lazy: not an import\n"
        "    import e\n"
    )
    assert unmarked_local_imports(src) == [3, 8, 10]


def offenders(root: str) -> list[str]:
    """``path:line: statement`` of each unmarked function-local import under ``root``."""
    out = []
    for path in sorted((REPO / root).rglob("*.py")):
        source = path.read_text()
        out += [f"{path.relative_to(REPO)}:{n}: {source.splitlines()[n - 1].strip()}" for n in unmarked_local_imports(source)]
    return out


@pytest.mark.parametrize("root", CHECKED)
def test_every_function_local_import_says_why_it_loads_late(root: str) -> None:
    found = offenders(root)
    assert found == [], "imports inside functions without a '# lazy: why' comment (hoist them, or say why):\n" + "\n".join(found)


if __name__ == "__main__":
    # `python tests/test_house.py`: the offenders, one a line, as a check to run by hand
    for root in CHECKED:
        for line in offenders(root):
            print(line)
