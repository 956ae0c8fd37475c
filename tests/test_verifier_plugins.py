"""User-written verifiers: the manual's example as a `module:Class` name and as an entry
point, its typed options and default traits, and one class per name."""

import importlib
import inspect
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import polars as pl
import pytest
from helpers import VERDICT_COLUMNS

import thresher.verifiers as verifiers
from thresher.verifiers import base, get_verifier, options_digest, registry, traits

ROOT = Path(__file__).resolve().parents[1]
SPEC = "mypkg.checks:EvenLength"


def readme_example() -> str:
    """The code of docs/verifiers.md's "Writing your own verifier" example, as printed there."""
    text = (ROOT / "docs" / "verifiers.md").read_text()
    return text.split("# mypkg/checks.py\n", 1)[1].split("```", 1)[0]


@pytest.fixture
def own_registry(monkeypatch):
    """The registry as it is now (built-ins loaded), given back as it was afterwards."""
    registry()
    monkeypatch.setattr(base, "_REGISTERED", dict(base._REGISTERED))


@pytest.fixture
def mypkg(tmp_path, monkeypatch, own_registry):
    """A package `mypkg` whose `checks` module is the manual's example, on sys.path."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "checks.py").write_text(readme_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for module in ("mypkg.checks", "mypkg"):
        sys.modules.pop(module, None)


def batch(texts: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "candidate_id": [f"c{i}" for i in range(len(texts))],
            "prompt_id": ["p"] * len(texts),
            "text": texts,
            "answer": [None] * len(texts),
        },
        schema={"candidate_id": pl.String, "prompt_id": pl.String, "text": pl.String,
                "answer": pl.String},
    )  # fmt: skip


def test_a_module_class_name_imports_and_registers_it_under_its_name(mypkg):
    assert "even_length" not in registry()
    verifier = get_verifier(SPEC)
    assert registry()["even_length"] is type(verifier)
    assert verifiers.verifier_name(SPEC) == "even_length"
    out = verifier.run(batch(["ab", "abc", ""]))
    assert out.columns == VERDICT_COLUMNS
    assert out["verifier"].to_list() == ["even_length"] * 3  # verdict rows carry the name
    assert out["passed"].to_list() == [True, False, True]
    assert out["reason"].to_list() == ["2 characters", "3 characters", "0 characters"]
    # once imported, either spelling finds it, and both give its verdicts one identity
    assert get_verifier("even_length", {"min_chars": 3}).run(batch(["ab"]))["passed"][0] is False
    assert options_digest(SPEC, {"min_chars": 3}) == options_digest("even_length", {"min_chars": 3})
    assert options_digest(SPEC) != options_digest(SPEC, {"min_chars": 3})


def test_its_typed_options_are_checked_field_by_field(mypkg):
    bad = "bad options for verifier 'mypkg.checks:EvenLength'"
    with pytest.raises(ValueError) as e:
        get_verifier(SPEC, {"min_chars": -1})
    assert str(e.value) == f"{bad}: min_chars: Input should be greater than or equal to 0"
    with pytest.raises(ValueError, match="min_chars: Input should be a valid integer"):
        get_verifier(SPEC, {"min_chars": "ten"})
    with pytest.raises(ValueError) as e:
        get_verifier(SPEC, {"min_char": 2, "min_chars": -1})
    assert str(e.value).splitlines() == [
        f"{bad}:",
        "  min_chars: Input should be greater than or equal to 0",
        "  min_char: unknown option (known: min_chars)",
    ]
    with pytest.raises(ValueError, match="min_chars"):  # built directly, it checks them too
        registry()["even_length"](min_chars=-1)


def test_its_traits_default(mypkg):
    assert (
        traits(SPEC)
        == traits("even_length")
        == {
            "version": 1,
            "uses_device": False,
            "ranks": False,
            "groups": False,
            "uses_reference": False,
            "reads_tool_output": False,
            "operational": frozenset(),
        }
    )


def test_a_name_is_one_class(mypkg):
    from mypkg.checks import EvenLength

    with pytest.raises(TypeError, match="name 'even_length' is taken"):

        class Other(base.Verifier):
            name = "even_length"

            def run(self, batch):
                return batch

    with pytest.raises(TypeError, match="name 'math' is taken"):

        class MyMath(base.Verifier):
            name = "math"

            def run(self, batch):
                return batch

    assert registry()["even_length"] is EvenLength and registry()["math"].__name__ == "MathAnswer"
    # the same class defined again (its module reloaded) takes its own name back
    importlib.reload(sys.modules["mypkg.checks"])
    assert registry()["even_length"] is not EvenLength
    # a subclass without a name of its own is no second verifier of that name
    sub = type("Sub", (registry()["even_length"],), {})
    assert registry()["even_length"] is not sub


def test_a_verifier_class_that_cannot_be_one_is_refused(own_registry):
    from pydantic import BaseModel

    def define(**body):
        return type("Broken", (base.Verifier,), {"run": lambda self, b: b, **body})

    with pytest.raises(TypeError, match="does not define run"):
        type("NoRun", (base.Verifier,), {"name": "no_run"})
    with pytest.raises(TypeError, match="without ':'"):
        define(name="a:b")
    with pytest.raises(TypeError, match="non-empty string"):
        define(name="")
    with pytest.raises(TypeError, match="Options must be a pydantic model"):
        define(name="plain_options", Options=dict)
    with pytest.raises(TypeError, match=r"operational names no option: \['workers'\]"):
        define(name="stray", operational=frozenset({"workers"}))

    class Options(BaseModel):
        workers: int = 1

    assert define(name="fine", Options=Options, operational=frozenset({"workers"}))
    assert "fine" in registry()


def test_a_config_names_it_by_its_import_path_and_a_rule_by_its_name(mypkg):
    from thresher.config import VerifyConfig

    cfg = VerifyConfig(
        verifiers=["math", SPEC],
        by_task={"code": ["code", SPEC]},
        options={SPEC: {"min_chars": 2}},
        rule="math and even_length",
    )
    # from here on it goes by its name, as its verdict rows do
    assert cfg.verifiers == ["math", "even_length"]
    assert cfg.by_task == {"code": ["code", "even_length"]}
    assert cfg.options == {"even_length": {"min_chars": 2}}
    assert VerifyConfig(**cfg.model_dump()) == cfg  # in this process, the name is known
    plain = VerifyConfig(verifiers=["math"], rule="math")
    assert plain.verifiers == ["math"]
    missing = r"importing nosuchpkg.checks failed \(No module named 'nosuchpkg'\)"
    with pytest.raises(ValueError, match=missing):
        VerifyConfig(verifiers=["nosuchpkg.checks:EvenLength"])
    with pytest.raises(ValueError, match="has no Verifier subclass Missing"):
        VerifyConfig(verifiers=["mypkg.checks:Missing"])
    with pytest.raises(ValueError, match="given twice"):
        VerifyConfig(verifiers=[SPEC], options={SPEC: {}, "even_length": {}})
    with pytest.raises(ValueError, match="unknown verifier"):
        VerifyConfig(verifiers=["even_lenght"])


def test_entry_points_are_loaded_once_by_the_registry(mypkg, monkeypatch):
    dist = mypkg / "mypkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[thresher.verifiers]\neven_length = mypkg.checks:EvenLength\n"
        "broken = mypkg.nosuchmodule:Nothing\n"
    )
    monkeypatch.setitem(verifiers._LOADED, "plugins", False)
    monkeypatch.setattr(verifiers, "_PLUGINS", set())
    with pytest.warns(RuntimeWarning, match="verifier plugin broken = mypkg.nosuchmodule"):
        known = registry()
    assert "even_length" in known and "math" in known  # a broken plugin stops no other one
    assert "mypkg.checks" in sys.modules
    # configs call it by its name; another process finds it by its name too
    assert get_verifier("even_length").run(batch(["ab"]))["passed"][0] is True
    assert verifiers.portable_name("even_length") == "even_length"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry()  # loaded once: the broken one is not tried again


def test_another_process_imports_it_by_its_module(mypkg):
    get_verifier(SPEC)
    assert verifiers.portable_name("even_length") == SPEC
    assert verifiers.portable_name("math") == "math"


def test_the_verify_command_runs_it(mypkg):
    src = mypkg / "cands.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": i, "prompt": "Say something.", "completion": c}) + "\n"
            for i, c in enumerate(["ab", "abc"])
        )
    )
    out = mypkg / "verdicts.jsonl"
    path = [str(mypkg), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    cmd = [sys.executable, "-m", "thresher.flows.cli", "verify", str(src), "-v", SPEC]
    res = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["candidate_id"], r["verifier"], r["passed"]) for r in rows] == [
        ("0", "even_length", True),
        ("1", "even_length", False),
    ]
    options = json.dumps({SPEC: {"min_chars": -1}})
    res = subprocess.run([*cmd, "--options", options], capture_output=True, text=True, env=env)
    assert res.returncode == 2
    assert "min_chars: Input should be greater than or equal to 0" in res.stderr


def test_built_in_options_match_their_constructors():
    """Each built-in's Options has its constructor's keywords, with the same defaults."""
    from thresher.sandbox import Limits

    for name, cls in registry().items():
        if not cls.__module__.startswith("thresher.verifiers."):
            continue
        fields = cls.Options.model_fields
        params = {
            p.name: p.default
            for p in inspect.signature(cls.__init__).parameters.values()
            if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD
        }
        if cls.__init__ is base.Verifier.__init__:
            params = {}
        if name == "code":  # its other keywords are the sandbox's limits
            limits = inspect.signature(Limits).parameters.values()
            params |= {p.name: p.default for p in limits}
        assert set(params) == set(fields), name
        for key, default in params.items():
            if default is not inspect.Parameter.empty:
                assert fields[key].default == default, (name, key)
            else:
                assert fields[key].is_required(), (name, key)
