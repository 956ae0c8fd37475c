import pytest

from thresher.config import ConfigError, CurateConfig, load_config
from thresher.identities import run_id_for

BASE = {"name": "x", "model": "m", "prompts": {"dataset": "d"}}


def test_defaults():
    cfg = CurateConfig(**BASE)
    assert (cfg.sampling.k, cfg.sampling.temperature, cfg.sampling.top_p) == (8, 0.7, 0.9)
    assert cfg.model_id == "m"


def test_greedy_needs_k_1():
    with pytest.raises(ValueError, match="use k: 1"):
        CurateConfig(**BASE, sampling={"temperature": 0})
    CurateConfig(**BASE, sampling={"temperature": 0, "k": 1})


def test_lora_is_part_of_the_model_identity():
    cfg = CurateConfig(**BASE, lora="adapters/a")
    assert cfg.model_id == "m+lora:adapters/a"
    assert run_id_for(cfg) != run_id_for(CurateConfig(**BASE))
    with pytest.raises(ValueError, match="lora applies to the local engine"):
        CurateConfig(**BASE, lora="a", server={"base_url": "http://127.0.0.1:1/v1"})


def test_run_id_ignores_where_and_how_fast():
    a = CurateConfig(**BASE)
    b = CurateConfig(**BASE, batch_size=7, lake="/elsewhere", engine={"dtype": "bfloat16"})
    assert run_id_for(a) == run_id_for(b)
    assert run_id_for(a) != run_id_for(CurateConfig(**BASE, sampling={"top_p": 0.5}))


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such config"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


def test_bundled_configs_are_valid():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert len(configs) >= 2
    from thresher.config import BootstrapConfig, TrainConfig

    kinds = {"train": TrainConfig, "bootstrap": BootstrapConfig}
    for path in configs:
        load_config(path, kinds.get(path.name.split("-")[0]))
    assert load_config(configs[0].with_name("demo.yaml")).select.cap == 2


def test_verify_section_is_checked():
    with pytest.raises(ValueError, match="unknown verifier"):
        CurateConfig(**BASE, verify={"verifiers": ["maths"]})
    with pytest.raises(ValueError, match="never run"):
        CurateConfig(**BASE, verify={"verifiers": ["math"], "rule": "math and format"})
    with pytest.raises(ValueError, match="only verifier names"):
        CurateConfig(**BASE, verify={"verifiers": ["math"], "rule": "math + 1"})
    v = CurateConfig(
        **BASE, verify={"verifiers": ["math", "format"], "by_task": {"code": ["code"]}}
    ).verify
    assert v.for_task("code") == ["code"] and v.for_task("algebra") == ["math", "format"]
    assert v.all_names() == ["math", "format", "code"]


def test_config_changes_name_each_changed_setting():
    from thresher.stores.runs import config_changes

    before = CurateConfig(**BASE).model_dump()
    after = CurateConfig(**BASE, select={"cap": 3}, sampling={"k": 6}).model_dump()
    assert config_changes(before, after) == ["sampling.k 8 -> 6", "select.cap 4 -> 3"]
    assert config_changes(before, before) == []


def _bootstrap(**over):
    from thresher.config import BootstrapConfig

    base = dict(
        name="b",
        base_model="m",
        prompts={"dataset": "d"},
        eval={"prompts": {"dataset": "d", "split": "eval"}},
    )
    return BootstrapConfig(**(base | over))


def test_held_out_metrics_keep_only_verifiers_with_a_reference():
    cfg = _bootstrap(verify={"verifiers": ["math", "format"], "rule": "math and format"})
    held_out = cfg.eval_config(1, "m1").verify
    assert held_out.verifiers == ["math"] and held_out.rule is None
    assert cfg.curate_config(1, "m1").verify.verifiers == ["math", "format"]
    by_task = _bootstrap(
        verify={"verifiers": ["exact"], "by_task": {"code": ["code", "regex"]}, "rule": None}
    )
    assert by_task.eval_verify().by_task == {"code": ["code"]}


def test_an_evaluation_without_a_reference_is_refused():
    with pytest.raises(ValueError, match="rest only on majority"):
        _bootstrap(verify={"verifiers": ["majority"]})
    with pytest.raises(ValueError, match=r"reward \(by_task.t\)"):
        _bootstrap(
            verify={"verifiers": ["math"], "by_task": {"t": ["reward"]}},
            eval={
                "prompts": {"dataset": "d", "split": "eval"},
                "verify": {"verifiers": ["exact"], "by_task": {"t": ["reward"]}},
            },
        )
    # its own eval verifiers make a reference-free training signal measurable
    own = _bootstrap(
        verify={"verifiers": ["majority"]},
        eval={"prompts": {"dataset": "d", "split": "eval"}, "verify": {"verifiers": ["exact"]}},
    )
    assert own.eval_config(0, "m").verify.verifiers == ["exact"]
    assert own.curate_config(0, "m").verify.verifiers == ["majority"]
