"""CONTRIBUTING.md against the code: every path it names exists, every link lands on a
heading, every `make` target is in the Makefile, and every code name it gives is defined in
the module it attributes the name to.

A sentence attributes a name to the path nearest before it in that sentence (else the
first one after it): "add it to `BUILT_IN` in `verifiers/__init__.py`" checks that
verifiers/__init__.py defines BUILT_IN. A path is a file or folder (`stores/schemas.py`,
`flows/cli/`) or a dotted module (`thresher.verifiers.base.Verifier`); a folder defines what
its modules define, and its modules' names. Every name, attributed or not, must be defined
somewhere in the tree's .py files. Spans with a `<placeholder>` are skipped.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"

SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
NAME = r"[A-Za-z_][A-Za-z0-9_]*"
CODE = re.compile(rf"@?({NAME}(?:\.{NAME})*)(?:\(.*)?")  # `SCHEMAS`, `never(...)`, `a.b`
MODULE = re.compile(rf"thresher(?:\.{NAME})+")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\[])")
PLACEHOLDERS = {"module:Class"}  # the spelling of a name the reader chooses
SKIPPED_DIRS = {".venv", ".cache", "node_modules", "site"}


def spans(text: str) -> list[str]:
    return SPAN.findall(text)


def sentences(text: str) -> list[str]:
    """The text's sentences: paragraphs and list items split at sentence ends (code spans
    and link targets are not split)."""
    blocks = re.split(r"\n\s*\n|\n(?=\s*(?:\d+\.|-) )|\n(?=#)", text)
    out = []
    for block in blocks:
        flat = " ".join(block.split())
        out += [s for s in SENTENCE_END.split(flat) if s]
    return out


def kind(span: str) -> str:
    """What a code span names: path, module, make, command, code, placeholder or prose."""
    if "<" in span or span in PLACEHOLDERS:
        return "placeholder"
    if span.startswith("make "):
        return "make"
    if span == "thresher" or span.startswith("thresher "):
        return "command"
    if "/" in span or span.endswith((".py", ".md", ".yaml")):
        return "path"
    if MODULE.fullmatch(span):
        return "module"
    if CODE.fullmatch(span):
        return "code"
    return "prose"


@cache
def defined(path: Path) -> dict[str, set[str]]:
    """Names a .py file defines at any depth (functions, classes, assignments, annotated
    names, imports), and each class's own names under its name."""
    names: dict[str, set[str]] = {"": set()}
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, UnicodeDecodeError):
        return names
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[""].add(node.name)
        elif isinstance(node, ast.Assign):
            names[""].update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[""].add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names[""].update((a.asname or a.name).split(".")[0] for a in node.names)
        if isinstance(node, ast.ClassDef):
            own = names.setdefault(node.name, set())
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    own.add(stmt.name)
                elif isinstance(stmt, ast.Assign):
                    own.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    own.add(stmt.target.id)
    return names


def python_files(where: Path) -> list[Path]:
    """The .py files of a file or folder, leaving out hidden and build folders."""
    if where.is_file():
        return [where]
    return _python_files(where)


@cache
def _python_files(where: Path) -> list[Path]:
    out = []
    for folder, dirs, files in os.walk(where):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        out += [Path(folder) / f for f in sorted(files) if f.endswith(".py")]
    return out


def defines(where: Path, dotted: str) -> bool:
    """Whether `where` (a .py file, or a folder: its modules and what they define) defines
    `dotted`: its first name, and a class's own name after it (`CurateConfig.placement`)."""
    first, *rest = dotted.split(".")
    if where.is_dir() and ((where / f"{first}.py").exists() or (where / first).is_dir()):
        return True
    for path in python_files(where):
        names = defined(path)
        if first in names[""] and (not rest or first not in names or rest[0] in names[first]):
            return True
    return False


def module_file(dotted: str) -> tuple[Path | None, str]:
    """The source file of the longest importable module `dotted` starts with, and the rest
    (None: no module)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:n]))
        except (ImportError, ValueError):  # a module's attribute, not a submodule
            continue
        if spec is not None and spec.origin:
            return Path(spec.origin), ".".join(parts[n:])
    return None, dotted


def attributed(sentence: str) -> list[tuple[str, Path | None]]:
    """Each code name of the sentence with the path it is attributed to (None: none)."""
    found = [(s, kind(s)) for s in spans(sentence)]
    scopes = []
    for i, (s, k) in enumerate(found):
        if k == "path" and ((ROOT / s).is_dir() or s.endswith(".py")):
            scopes.append((i, ROOT / s))
        elif k == "module" and module_file(s)[0] is not None:
            scopes.append((i, module_file(s)[0]))
    out = []
    for i, (s, k) in enumerate(found):
        if k != "code":
            continue
        before = [p for j, p in scopes if j < i]
        after = [p for j, p in scopes if j > i]
        name = CODE.fullmatch(s).group(1)
        out.append((name, before[-1] if before else after[0] if after else None))
    return out


def slug(heading: str) -> str:
    """A heading's anchor as the docs site makes it (Python-Markdown's toc)."""
    text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore")
    text = re.sub(r"[^\w\s-]", "", text.decode()).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def problems(text: str) -> list[str]:
    """Every mismatch between the text and the tree, one line each."""
    out = []
    for span in spans(text):
        k = kind(span)
        if k == "prose":
            out.append(f"`{span}`: neither a path, a module, a command nor a code name")
        elif k == "path" and not (ROOT / span).exists():
            out.append(f"`{span}`: no such file or folder")
        elif k == "module":
            path, rest = module_file(span)
            if path is None:
                out.append(f"`{span}`: no such module")
            elif rest and not defines(path, rest):
                out.append(f"`{span}`: {path.relative_to(ROOT)} defines no `{rest}`")
        elif k == "make":
            target = span.split()[1]
            makefile = (ROOT / "Makefile").read_text()
            if not re.search(
                rf"^(?:[\w.$%()-]+ )*{re.escape(target)}(?: [\w.$%()-]+)*:", makefile, re.M
            ):
                out.append(f"`{span}`: the Makefile has no target {target}")
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        if not (ROOT / file).exists():
            out.append(f"link {target}: no such file")
        elif anchor:
            headings = re.findall(r"^#+\s+(.+?)\s*$", (ROOT / file).read_text(), re.M)
            if anchor not in {slug(h) for h in headings}:
                out.append(f"link {target}: {file} has no heading #{anchor}")
    everywhere = python_files(ROOT)
    for sentence in sentences(text):
        for name, where in attributed(sentence):
            if where is not None and not defines(where, name):
                out.append(f"`{name}`: not defined in {where.relative_to(ROOT)} ({sentence!r})")
            elif where is None and not any(defines(p, name) for p in everywhere):
                out.append(f"`{name}`: defined nowhere in the tree ({sentence!r})")
    return out


def test_contributing_matches_the_code():
    assert problems(CONTRIBUTING.read_text()) == []


def test_every_code_span_is_checked():
    """No span of CONTRIBUTING.md escapes the checks as prose."""
    assert [s for s in spans(CONTRIBUTING.read_text()) if kind(s) == "prose"] == []


@pytest.mark.parametrize(
    "wrong, complaint",
    [
        ("Import it in `verifiers/__init__.py`'s `VERIFIERS`.", "not defined in verifiers"),
        ("The keys are `KEY` in `stores/schemas.py`.", "not defined in stores/schemas.py"),
        ("Subclass `Sampler` in `stores/schemas.py`.", "not defined in stores/schemas.py"),
        ("Set `CurateConfig.placements` in `thresher/config/curate.py`.", "`CurateConfig.plac"),
        ("Copy `tests/test_verifier_nothing.py`.", "no such file"),
        ("Subclass `thresher.verifiers.base.Verifiers`.", "defines no `Verifiers`"),
        ("A module in `flows/cli/` (`lake`, `plumbing`).", "`plumbing`: not defined in flows"),
        ("Call `no_such_function_here(...)`.", "defined nowhere"),
        ("See [the lake](docs/lake.md#no-such-heading).", "has no heading"),
        ("Run `make no-such-target`.", "no target"),
    ],
)
def test_a_mismatch_is_found(wrong, complaint):
    found = problems(wrong)
    assert found and complaint in found[0], found


def test_names_are_checked_in_the_module_the_sentence_names():
    right = "Its schema and key go in `stores/schemas.py` (`SCHEMAS`, `KEYS`)."
    assert problems(right) == []
    assert attributed(right) == [("SCHEMAS", ROOT / "stores/schemas.py")] + [
        ("KEYS", ROOT / "stores/schemas.py")
    ]
    assert [n for n, _ in attributed("Add `BUILT_IN` in `verifiers/__init__.py`.")] == ["BUILT_IN"]
