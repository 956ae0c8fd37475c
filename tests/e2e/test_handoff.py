"""The hand-off to RL trainers: a real curate run's pass rates, `export --format rl` in verl's
and TRL's layouts, TRL's own GRPOTrainer training on them with thresher's reward function
(its logged rewards equal `thresher verify`'s scores), verl's compute_score on the same
completions, the dataset cards of every export, and the curate run in MLflow."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from thresher.config import CurateConfig
from thresher.flows.curate import run_curate
from thresher.ingest.load import ingest
from thresher.stores.card import read_card
from thresher.stores.lake import Lake

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"
K, PROMPTS, LOW, HIGH = 4, 60, 0.25, 0.75
CLI = [sys.executable, "-m", "thresher.flows.cli"]


def _thresher(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def curated(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("handoff")
    lake = Lake(root / "lake")
    for split in ("train", "eval"):
        ingest(lake, EXAMPLES / f"{split}.jsonl", dataset="arith", split=split,
               mapping={"prompt": "question"}, task="arithmetic")  # fmt: skip
    cfg = CurateConfig(
        name="handoff",
        model=str(tiny_model),
        batch_size=30,
        prompts={"dataset": "arith", "limit": PROMPTS},
        sampling={"k": K, "max_tokens": 16, "temperature": 1.0, "seed": 3},
        engine={"dtype": "float32", "max_model_len": 256},
        verify={"verifiers": ["math"]},
        select={"cap": 2},
        tracking={"tracking_uri": f"sqlite:///{root / 'mlflow.db'}"},
    )
    summary = run_curate(cfg, lake.root, progress=False)
    return lake, cfg, summary, root


def _hand_rates(lake: Lake, model: str) -> dict[str, float]:
    """Per train prompt: the share of its samples every verifier passed, counted here."""
    rows = lake.query(
        """SELECT c.candidate_id, c.prompt_id, v.passed FROM candidates c
           JOIN prompts p ON p.prompt_id = c.prompt_id
           JOIN verdicts v ON v.candidate_id = c.candidate_id
           WHERE c.model = ? AND p.split = 'train'""",
        [model],
    ).rows()
    per: dict[str, list[bool]] = {}
    for _, prompt, passed in rows:
        per.setdefault(prompt, []).append(passed)
    return {p: sum(v) / len(v) for p, v in per.items()}


@pytest.fixture(scope="module")
def rl_export(curated):
    lake, cfg, _, root = curated
    out = root / "rl"
    res = _thresher("export", "--format", "rl", "--min-pass", str(LOW), "--max-pass",
                    str(HIGH), "--to", str(out), "--lake", str(lake.root))  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_pass_rate_history_and_the_band_match_a_hand_count(curated, rl_export):
    lake, cfg, _, _ = curated
    rates = _hand_rates(lake, cfg.model_id)
    assert len(rates) == PROMPTS
    view = dict(
        lake.query(
            "SELECT prompt_id, pass_rate FROM prompt_pass_rates WHERE model = ? "
            "AND split = 'train'",
            [cfg.model_id],
        ).rows()
    )
    assert view == pytest.approx(rates)
    in_band = {p for p, r in rates.items() if LOW <= r <= HIGH}
    assert 0 < len(in_band) < PROMPTS, "the tiny model solves some prompts sometimes"
    table = pq.read_table(rl_export / "train.parquet")
    got = {e["prompt_id"]: e["pass_rate"] for e in table.column("extra_info").to_pylist()}
    assert set(got) == in_band
    assert got == pytest.approx({p: rates[p] for p in in_band})


def test_the_verl_parquet_has_verls_columns(curated, rl_export):
    lake, cfg, _, _ = curated
    table = pq.read_table(rl_export / "train.parquet")
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    rows = table.to_pylist()
    answers = dict(lake.query("SELECT prompt_id, answer FROM prompts").rows())
    for i, r in enumerate(rows):
        assert r["data_source"] == "arith" and r["ability"] == "arithmetic"
        assert r["prompt"][0]["role"] == "user" and r["prompt"][0]["content"].startswith("What")
        truth = answers[r["extra_info"]["prompt_id"]]
        assert r["reward_model"] == {"style": "rule", "ground_truth": truth}
        assert r["extra_info"]["index"] == i and r["extra_info"]["model"] == cfg.model_id
        assert json.loads(r["extra_info"]["verifiers"])["verifiers"] == ["math"]


def test_an_eval_overlap_is_left_out(curated, tmp_path):
    lake, cfg, _, _ = curated
    rates = _hand_rates(lake, cfg.model_id)
    banded = sorted(p for p, r in rates.items() if LOW <= r <= HIGH)
    text = lake.query("SELECT prompt FROM prompts WHERE prompt_id = ?", [banded[0]])[0, 0]
    leak = tmp_path / "leak.jsonl"
    leak.write_text(json.dumps({"prompt": text, "answer": "0"}) + "\n")
    other = Lake(tmp_path / "copy")
    import shutil

    shutil.copytree(lake.root, other.root, dirs_exist_ok=True)
    ingest(other, leak, dataset="leak", split="eval", task="arithmetic")
    res = _thresher("export", "--format", "rl", "--min-pass", str(LOW), "--max-pass", str(HIGH),
                    "--to", str(tmp_path / "out"), "--lake", str(other.root))  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "1 left out as eval overlaps" in res.stdout
    ids = [e["prompt_id"] for e in pq.read_table(tmp_path / "out" / "train.parquet")
           .column("extra_info").to_pylist()]  # fmt: skip
    assert banded[0] not in ids and len(ids) == len(banded) - 1
    card = read_card(tmp_path / "out" / "README.md")["thresher"]
    assert card["band"]["contaminated"] == 1 and "leak" in card["decontamination"]["eval_datasets"]


def _weights_sha(model: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(model.rglob("*.safetensors")):
        digest.update(str(f.relative_to(model)).encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("fmt", ["sft", "dpo", "rl"])
def test_every_export_writes_a_card_that_matches_the_lake(curated, tmp_path, fmt, tiny_model):
    import thresher
    from thresher.verifiers import traits

    lake, cfg, _, _ = curated
    out = tmp_path / fmt
    args = ["--round", "0", "--name", "handoff"] if fmt != "rl" else []
    res = _thresher("export", "--format", fmt, *args, "--to", str(out), "--lake", str(lake.root))
    assert res.returncode == 0, res.stderr[-3000:]
    header = read_card(out / "README.md")
    info = header["thresher"]
    if fmt == "rl":
        rows = pq.read_table(out / "train.parquet").to_pylist()
    else:
        rows = [json.loads(x) for x in (out / "data.jsonl").read_text().splitlines()]
    assert info["rows"] == len(rows) and info["format"] == fmt
    assert header["license"] == "apache-2.0"  # the bundled examples' licence
    assert header["task_categories"] == (["reinforcement-learning"] if fmt == "rl"
                                         else ["text-generation"])  # fmt: skip
    assert header["size_categories"] == ["n<1K"]
    data = header["configs"][0]["data_files"][0]["path"]
    assert (out / data).exists()
    assert info["thresher_version"] == thresher.__version__
    (source,) = info["source_datasets"]
    assert source["dataset"] == "arith" and source["source"].endswith("arithmetic/train.jsonl")
    want = [{"model": str(tiny_model), "weights_sha256": _weights_sha(tiny_model)}]
    assert info["models"] == want
    run = lake.query("SELECT run_id, config FROM runs WHERE flow = 'curate'").row(0, named=True)
    (made,) = info["runs"]
    assert made["run_id"] == run["run_id"]
    recorded = json.loads(run["config"])
    assert made["sampling"] == recorded["sampling"] and made["verify"] == recorded["verify"]
    select = {k: v for k, v in recorded["select"].items() if k != "decontaminate"}
    assert made["select"] == select and made["select"]["cap"] == 2
    assert made["decontaminate"] == recorded["select"]["decontaminate"]
    assert info["verifiers"] == {"math": traits("math")["version"]}
    assert info["decontamination"]["eval_datasets"] == ["arith"]
    # the card's SQL lists the exported rows
    listed = lake.query(info["sql"])
    if fmt == "rl":
        assert sorted(listed["prompt_id"]) == sorted(r["extra_info"]["prompt_id"] for r in rows)
        assert info["band"]["model"] == cfg.model_id
        assert (info["band"]["low"], info["band"]["high"]) == (0.2, 0.8)  # the defaults
        rates = _hand_rates(lake, cfg.model_id)
        in_band = sum(0.2 <= r <= 0.8 for r in rates.values())
        [funnel] = info["funnel"]
        assert funnel == {"measured": len(rates), "in_band": in_band,
                          "contaminated": in_band - len(rows), "rows": len(rows)}  # fmt: skip
    else:
        funnel = lake.query("SELECT * FROM round_funnel WHERE round = 0").to_dicts()
        assert info["funnel"] == funnel
        key = "candidate_id" if fmt == "sft" else "chosen_id"
        assert {r[key] for r in rows} <= set(listed["candidate_id"])
        if fmt == "sft":
            assert sorted(listed["candidate_id"]) == sorted(r["candidate_id"] for r in rows)


def test_push_to_hub_sends_the_data_then_the_card(curated, tmp_path, monkeypatch):
    """The Hub is out of reach here: `datasets`' push and the card's upload are recorded
    instead of sent (everything before them is the real path)."""
    import datasets
    import huggingface_hub

    from thresher.flows.handoff import export_rl, push_to_hub

    lake, _, _, _ = curated
    calls = []

    def push(self, repo, **kw):
        calls.append(("data", repo, self.num_rows))

    def upload(self, **kw):
        calls.append(("file", kw["repo_id"], kw["path_in_repo"]))

    monkeypatch.setattr(datasets.Dataset, "push_to_hub", push)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_file", upload)
    got = export_rl(lake, tmp_path / "rl", low=LOW, high=HIGH)
    url = push_to_hub(tmp_path / "rl", "me/arith-rl", "rl")
    assert url == "https://huggingface.co/datasets/me/arith-rl"
    assert calls == [("data", "me/arith-rl", got["rows"]), ("file", "me/arith-rl", "train.parquet"),
                     ("file", "me/arith-rl", "README.md")]  # fmt: skip


def test_the_curate_run_is_in_mlflow(curated):
    from mlflow.tracking import MlflowClient

    lake, cfg, summary, root = curated
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("handoff").experiment_id])
    assert run.data.tags["thresher.flow"] == "curate"
    assert run.data.metrics["kept"] == summary["kept"]
    assert run.data.metrics["candidates"] == PROMPTS * K
    assert run.data.params["sampling.k"] == str(K) and run.data.params["model"] == cfg.model


@pytest.fixture(scope="module")
def grpo(curated, rl_export, tiny_model):
    """TRL's GRPOTrainer, 4 steps on the CPU, rewarded by thresher on the RL export; every
    step's completions and the rewards TRL logged for them."""
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from thresher.verifiers.rewards import reward_function

    _, _, _, root = curated
    data = datasets.load_from_disk(str(rl_export / "trl"))
    reward = reward_function()  # each row's own verifiers (math)
    args = GRPOConfig(
        output_dir=str(root / "grpo"), max_steps=4, per_device_train_batch_size=4,
        num_generations=4, max_completion_length=12, learning_rate=1e-4, logging_steps=1,
        report_to="none", use_cpu=True, bf16=False, save_strategy="no", seed=0,
        log_completions=False, temperature=1.0,
    )  # fmt: skip
    trainer = GRPOTrainer(model=str(tiny_model), reward_funcs=reward, args=args,
                          train_dataset=data)  # fmt: skip
    steps = []

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            logs = trainer._logs
            steps.append(
                {
                    "prompts": list(logs["prompt"]),
                    "completions": list(logs["completion"]),
                    "rewards": list(logs["rewards"][reward.__name__]),
                    "reasons": list(logs["extra"].get("thresher_reason", [])),
                }
            )

    trainer.add_callback(Record())
    trainer.train()
    return trainer, steps, data


def test_grpo_rewards_equal_thresher_verify(grpo, tmp_path):
    from thresher.verifiers.rewards import completion_text

    trainer, steps, data = grpo
    assert trainer.state.global_step == 4 and len(steps) == 4
    answers = {r["question"]: r["answer"] for r in data}
    lines, rewards = [], []
    for step in steps:
        assert len(step["completions"]) == len(step["rewards"]) == 4
        for prompt, completion, reward in zip(step["prompts"], step["completions"],
                                              step["rewards"], strict=True):  # fmt: skip
            question = prompt[-1]["content"]
            lines.append({"prompt": question, "answer": answers[question],
                          "completion": completion_text(completion)})  # fmt: skip
            rewards.append(reward)
    # and two rows' references stated right and wrong: the agreement is not all zeros
    from thresher.verifiers.rewards import reward_function

    hand = [data[i] for i in range(2)]
    texts = [f"The answer is {r['answer']}." for r in hand]
    texts += [f"The answer is {r['answer']}7." for r in hand]
    columns = {c: [r[c] for r in hand] * 2 for c in data.column_names if c != "prompt"}
    assert reward_function()(texts, **columns) == [1.0, 1.0, 0.0, 0.0]
    lines += [{"prompt": r["question"], "answer": r["answer"], "completion": t}
              for r, t in zip(hand * 2, texts, strict=True)]  # fmt: skip
    rewards += [1.0, 1.0, 0.0, 0.0]
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = _thresher("verify", str(path), "-v", "math", "-o", str(tmp_path / "v.jsonl"))
    assert res.returncode == 0, res.stderr[-3000:]
    verdicts = [json.loads(x) for x in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [v["score"] for v in verdicts] == rewards
    # and the means TRL logged per step are those rewards' means
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    means = [sum(rewards[i : i + 4]) / 4 for i in range(0, 16, 4)]
    assert logged == pytest.approx(means)
    assert all(r.startswith("math: ") for s in steps for r in s["reasons"])


def test_verls_compute_score_agrees_on_the_same_completions(grpo, rl_export):
    from thresher.verifiers.rewards import completion_text, compute_score

    _, steps, _ = grpo
    rows = {r["extra_info"]["question"]: r for r in pq.read_table(rl_export / "train.parquet")
            .to_pylist()}  # fmt: skip
    sols, truths, infos, want = [], [], [], []
    for step in steps:
        for prompt, completion, reward in zip(step["prompts"], step["completions"],
                                              step["rewards"], strict=True):  # fmt: skip
            row = rows[prompt[-1]["content"]]
            sols.append(completion_text(completion))
            truths.append(row["reward_model"]["ground_truth"])
            infos.append(row["extra_info"])
            want.append(reward)
    one = [compute_score(row["data_source"], s, t, i)["score"]
           for row, s, t, i in zip([rows[i["question"]] for i in infos], sols, truths, infos,
                                   strict=True)]  # fmt: skip
    batch = compute_score(data_sources=["arith"] * len(sols), solution_strs=sols,
                          ground_truths=truths, extra_infos=infos)  # fmt: skip
    assert one == want and [b["score"] for b in batch] == want
    # a reference stated right and wrong, through verl's signature
    row = next(iter(rows.values()))
    truth, info = row["reward_model"]["ground_truth"], row["extra_info"]
    right = compute_score("arith", f"The answer is {truth}.", truth, info)
    wrong = compute_score("arith", f"The answer is {truth}7.", truth, info)
    assert (right["score"], right["passed"]) == (1.0, True)
    assert (wrong["score"], wrong["passed"]) == (0.0, False) and wrong["reason"].startswith("math")


def test_a_hanging_candidate_costs_at_most_the_verifiers_timeout():
    from thresher.verifiers.rewards import reward_function

    reward = reward_function(["code"], {"code": {"timeout_s": 1.0}})
    tests = json.dumps(["assert add(1, 2) == 3"])
    reasons = []
    scores = reward(
        ["def add(a, b):\n    while True:\n        pass\n", "def add(a, b):\n    return a + b\n"],
        question=["Write add(a, b)."] * 2, tests=[tests] * 2, answer=[None, None],
        log_extra=lambda name, values: reasons.extend(values),
    )  # fmt: skip
    assert scores == [0.0, 1.0]
    # the option reached the sandbox: the loop was stopped at 1 s, not the default 10 s
    assert reasons[0] in ("code: timed out after 1 s", "code: timed out after 1.0 s"), reasons
