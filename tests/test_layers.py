"""The layering: work packages never import `flows`, and only reach each other through
tables (`stores`) and the shared modules (`thresher.config`, `.ids`, `.cluster`,
`.intervals`)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> the other work packages it may import
ALLOWED = {
    "samplers": set(),
    # the judge verifier generates with the samplers' engine (one engine per process)
    "verifiers": {"samplers"},
    "selection": {"stores"},
    "trainers": set(),
    "evaluators": {"stores"},
    "stores": set(),
}

PROBE = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module("thresher." + sys.argv[1])
for info in pkgutil.iter_modules(pkg.__path__):
    importlib.import_module(f"thresher.{sys.argv[1]}.{info.name}")
print(json.dumps(sorted(m for m in sys.modules if m.startswith("thresher."))))
"""


@pytest.mark.parametrize("package", list(ALLOWED))
def test_work_packages_import_no_flow_and_no_other_stage(package):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, package], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    packages = {m.split(".")[1] for m in loaded if m.count(".") >= 2}
    assert "flows" not in packages, f"{package} imports thresher.flows"
    others = packages & set(ALLOWED) - {package}
    assert others <= ALLOWED[package], f"{package} imports {sorted(others - ALLOWED[package])}"


def test_flows_write_no_table():
    """Every table write goes through `stores` (one writer per table)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "flows").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if '.append("' in line or "lake.append(" in line
    ]
    assert not offenders, offenders


def _imports_of(package: str) -> dict[str, set[str]]:
    """Work packages each module of `package` imports anywhere, lazily inside a function too."""
    import ast

    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        found[str(path.relative_to(ROOT))] = {
            n.split(".")[1] for n in names if n.startswith("thresher.") and n.count(".") >= 1
        }
    return found


@pytest.mark.parametrize("package", list(ALLOWED))
def test_no_lazy_import_crosses_the_layers_either(package):
    for module, packages in _imports_of(package).items():
        others = packages & (set(ALLOWED) | {"flows"}) - {package}
        assert others <= ALLOWED[package], f"{module} imports {sorted(others - ALLOWED[package])}"
