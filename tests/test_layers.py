"""The layering: work packages never import `flows`, and only reach each other through
tables (`stores`) and the shared modules (`thresher.config`, `.ids`, `.cluster`,
`.intervals`, `.rules`, `.sandbox`); flows only orchestrate: they call stages, never a table writer
or SQL; the shared modules import no work package."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> the other work packages it may import
ALLOWED = {
    "ingest": {"stores"},
    "samplers": {"stores"},
    # the judge verifier generates with the samplers' engine (one engine per process)
    "verifiers": {"samplers", "stores"},
    "selection": {"stores"},
    # the tiny demo models learn the synthetic problems ingest makes (ingest.synthetic)
    "trainers": {"stores", "ingest"},
    # round monitors read answers as the rule verifiers extract them (verifiers.extract) and
    # similarity as selection's near-duplicate removal hashes it (selection.minhash); an
    # evaluation's candidates are found by the samplers' candidate identity (expected_ids)
    "evaluators": {"stores", "verifiers", "selection", "samplers"},
    "stores": set(),
}
# shared module -> the work packages it may import (lazily, inside a function): the config
# checks verifier names against the verifiers' registry when it validates, and a run's
# identities and plan hold each verifier's digest and traits from that registry
SHARED_ALLOWED = {
    "thresher/config/verify.py": {"verifiers"},
    "thresher/config/curate.py": {"verifiers"},
    "thresher/identities.py": {"verifiers"},
    "thresher/plan.py": {"verifiers"},
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


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py"))


def _imported(tree: ast.AST) -> dict[str, str]:
    """name bound in the module -> the module it was imported from (every import, lazy
    ones inside functions too)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name
    return names


def _imports_of(folder: Path) -> dict[str, set[str]]:
    """Work packages (and flows) each module under `folder` imports anywhere."""
    found = {}
    for path in _modules(folder):
        mods = set(_imported(ast.parse(path.read_text())).values())
        found[str(path.relative_to(ROOT))] = {
            m.split(".")[1] for m in mods if m.startswith("thresher.") and m.count(".") >= 1
        }
    return found


@pytest.mark.parametrize("package", list(ALLOWED))
def test_no_lazy_import_crosses_the_layers_either(package):
    for module, packages in _imports_of(ROOT / package).items():
        others = packages & (set(ALLOWED) | {"flows"}) - {package}
        assert others <= ALLOWED[package], f"{module} imports {sorted(others - ALLOWED[package])}"


@pytest.mark.parametrize("folder", ["thresher", "sandbox"])
def test_shared_modules_import_no_stage_and_no_flow(folder):
    for module, packages in _imports_of(ROOT / folder).items():
        crossing = packages & (set(ALLOWED) | {"flows"})
        allowed = SHARED_ALLOWED.get(module, set())
        assert crossing <= allowed, f"{module} imports {sorted(crossing - allowed)}"


SQL_METHODS = {"query", "sql", "execute", "connect"}  # running SQL on the lake or DuckDB
SQL_WORDS = ("SELECT ", "INSERT ", "WITH ", "UPDATE ", "DELETE ", "CREATE ")


def flow_offences(source: str) -> list[str]:
    """What in a flows module does a stage's work: calling a table writer (a `write_*`
    function of `stores`, or a lake's `append(table, ...)`) or running SQL (a `.query`,
    `.sql`, `.execute` or `.connect` call, or an SQL statement in a string)."""
    tree = ast.parse(source)
    imported = _imported(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                origin = imported.get(f.id, "")
                if origin.startswith("thresher.stores.tables") or (
                    origin.startswith("thresher.stores.") and f.id.startswith("write_")
                ):
                    found.append(f"line {node.lineno}: calls the table writer {f.id}")
            elif isinstance(f, ast.Attribute):
                if f.attr in SQL_METHODS:
                    found.append(f"line {node.lineno}: runs SQL (.{f.attr})")
                elif f.attr.startswith("write_") and isinstance(f.value, ast.Name):
                    if imported.get(f.value.id, "").startswith("thresher.stores"):
                        found.append(f"line {node.lineno}: calls the table writer {f.attr}")
                elif f.attr == "append" and node.args:
                    first = node.args[0]
                    if isinstance(first, ast.Constant) and isinstance(first.value, str):
                        found.append(f"line {node.lineno}: appends to table {first.value!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = " ".join(node.value.split())  # SQL keywords are written in capitals here
            if text.startswith(SQL_WORDS) and " FROM " in text:
                found.append(f"line {node.lineno}: an SQL statement")
    return found


def test_flows_write_no_table_and_run_no_sql():
    """Every table write goes through `stores` (one writer per table), every query through
    a stage or a `stores` function: a flow only calls stages."""
    offences = [
        f"{path.relative_to(ROOT)} {what}"
        for path in _modules(ROOT / "flows")
        for what in flow_offences(path.read_text())
    ]
    assert not offences, offences


@pytest.mark.parametrize(
    "source",
    [
        "from thresher.stores.tables import write_verdicts\nwrite_verdicts(lake, v, d, r)",
        "def f(lake):\n    from thresher.stores import tables\n    tables.write_evals(lake, m, r)",
        "from thresher.stores.tables import write_labels as sink\nsink(lake, r)",
        "def f(lake):\n    lake.append('candidates', rows)",
        "def f(lake):\n    return lake.query('SELECT 1')",
        "def f(lake):\n    con = lake.connect()",
        "Q = '''SELECT count(*) FROM prompts'''",
    ],
)
def test_the_flow_check_catches_each_kind_of_offence(source):
    assert flow_offences(source), source


def test_the_flow_check_passes_orchestration():
    source = (
        "from thresher.verifiers.stage import verify_batch\n"
        "def f(lake, rows, pending):\n"
        "    pending.append(rows)\n"
        "    return verify_batch(lake, cfg, 'r', rows)\n"
        "HELP = 'select the candidates from a round'\n"
    )
    assert flow_offences(source) == []
