"""Training mixtures (train.mix): allocation, config checks, sources read from the lake, a
path source ingested once, and completion-only labels for a row of every source kind."""

import json

import pytest
from helpers import write_jsonl
from pydantic import ValidationError

from thresher.config import BootstrapTrainConfig, MixSource, TrainConfig
from thresher.ingest.load import ingest
from thresher.trainers.mix import MixError, allocate, mix_total, mixed_rows, pick, shares


@pytest.mark.parametrize(
    ("weights", "total"),
    [
        ([1, 1, 1], 100),
        ([1, 2, 4], 1000),
        ([0.1, 0.2, 0.7], 999),
        ([3, 7, 11, 13], 101),
        ([1e-3, 1, 1000], 12345),
        ([1 / 3, 1 / 3, 1 / 3], 200),
    ],
)
def test_largest_remainder_sums_exactly_and_meets_each_share_within_one_percent(weights, total):
    counts = allocate(weights, total)
    assert sum(counts) == total
    for count, share in zip(counts, shares(weights), strict=True):
        assert abs(count - total * share) < 1  # within one row of its quota
        assert abs(count / total - float(share)) <= 0.01


def test_largest_remainder_gives_the_leftover_rows_to_the_largest_remainders():
    # quotas 33.33, 33.33, 33.33 -> one row left, to the first (ties: earlier source)
    assert allocate([1, 1, 1], 100) == [34, 33, 33]
    # quotas 14.29, 28.57, 57.14 -> the leftover row goes to 28.57 (remainder .57)
    assert allocate([1, 2, 4], 100) == [14, 29, 57]
    assert allocate([1], 7) == [7]


def test_the_total_uses_self_once_else_repeats_nothing():
    # self has 300 rows and 3/4 of the weight: 400 rows, self's 300 used once
    assert mix_total([3, 1], [300, 20], self_index=0) == 400
    # self's quota never rounds above its rows
    total = mix_total([2, 1], [1001, 5], self_index=0)
    assert allocate([2, 1], total)[0] <= 1001
    # no self: as many rows as the smallest source (by its share) allows without repeating
    assert mix_total([1, 1], [50, 500], self_index=None) == 100


def test_pick_is_seeded_and_repeat_cycles_the_same_shuffle():
    rows = [{"i": i} for i in range(10)]
    a, b = pick(rows, 4, "0:x"), pick(rows, 4, "0:x")
    assert a == b and len({r["i"] for r in a}) == 4
    assert pick(rows, 4, "1:x") != a  # another seed, another choice
    many = pick(rows, 25, "0:x")
    used = [sum(r["i"] == i for r in many) for i in range(10)]
    assert sorted(set(used)) == [2, 3]  # each row 2 or 3 times
    assert many[:10] == many[10:20] == pick(rows, 10, "0:x")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"weight": 1}, "exactly one of pipeline, dataset or path"),
        ({"pipeline": "self", "dataset": "d", "weight": 1}, "got pipeline and dataset"),
        ({"dataset": "d", "weight": 0}, "greater than 0"),
        ({"dataset": "d", "weight": -1}, "greater than 0"),
        ({"dataset": "d"}, "weight"),
        ({"dataset": "d", "rounds": "all", "weight": 1}, "rounds applies to pipeline"),
        ({"pipeline": "p", "response": "meta.x", "weight": 1}, "response applies to dataset"),
        ({"dataset": "d", "response": "solution", "weight": 1}, "answer` or `meta.<key>"),
        ({"dataset": "d", "ingest_as": "x", "weight": 1}, "ingest_as applies to path"),
    ],
)
def test_bad_mix_sources_are_refused(source, message):
    with pytest.raises(ValidationError, match=message):
        MixSource(**source)


def test_bad_mixes_are_refused():
    base = {"name": "t", "base_model": "m"}
    with pytest.raises(ValidationError, match="at least one source"):
        TrainConfig(**base, mix=[])
    with pytest.raises(ValidationError, match="names a source twice: dataset:d"):
        TrainConfig(**base, mix=[{"dataset": "d", "weight": 1}, {"dataset": "d", "weight": 2}])
    with pytest.raises(ValidationError, match="mix_rows sizes a mix"):
        TrainConfig(**base, mix_rows=10)
    with pytest.raises(ValidationError, match="needs a `pipeline: self` source"):
        BootstrapTrainConfig(mix=[{"dataset": "d", "weight": 1}])
    BootstrapTrainConfig(mix=[{"pipeline": "self", "weight": 1}, {"dataset": "d", "weight": 1}])


def test_a_config_without_a_mix_dumps_as_before():
    """Run ids are digests of the dump: configs without a mix keep theirs."""
    cfg = TrainConfig(name="t", base_model="m")
    from thresher.identities import fields_of

    assert "mix" not in fields_of(cfg, "train") and "mix_rows" not in fields_of(cfg, "train")
    mixed = TrainConfig(name="t", base_model="m", mix=[{"pipeline": "self", "weight": 1}])
    assert mixed.model_dump()["mix"][0]["weight"] == 1
    assert TrainConfig(**mixed.model_dump()) == mixed


SFT_ROWS = [
    {"prompt": "Say hi.", "response": "hi"},
    {"prompt": "Say bye.", "completion": "bye"},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say yes."},
            {"role": "assistant", "content": "yes"},
        ]
    },
]
BAD_ROWS = [
    "{not json",
    {"prompt": "No answer here."},
    {"messages": [{"role": "user", "content": "Who speaks last?"}]},
    {"prompt": "Say no.", "response": ""},
]


def test_a_path_source_is_ingested_once_with_bad_rows_in_rejects(lake, tmp_path):
    path = write_jsonl(tmp_path / "general.jsonl", SFT_ROWS + BAD_ROWS)
    first = ingest(lake, path, "general", preset="sft")
    assert (first.ingested, first.rejected) == (3, 4)
    again = ingest(lake, path, "general", preset="sft")
    assert (again.ingested, again.already_present, again.rejected) == (0, 3, 4)
    assert again.prompt_ids == first.prompt_ids
    prompts = lake.query(
        "SELECT prompt, messages, answer, task FROM prompts WHERE dataset = 'general' ORDER BY line"
    ).to_dicts()
    assert [p["answer"] for p in prompts] == ["hi", "bye", "yes"]
    assert {p["task"] for p in prompts} == {"sft"}
    assert json.loads(prompts[2]["messages"])[-1] == {"role": "user", "content": "Say yes."}
    reasons = lake.query("SELECT reason FROM rejects ORDER BY line")["reason"].to_list()
    assert len(reasons) == 4  # a re-run adds no reject twice
    assert reasons[0].startswith("invalid JSON")
    assert reasons[1].startswith("missing response")
    assert "not the assistant's" in reasons[2]
    assert reasons[3] == "empty response"


def mix_lake(lake, tmp_path, n_self=30, n_ref=40):
    """A train config's own data (a JSONL of prompt/completion rows), a prompts dataset
    with reference answers (one without) and an SFT file."""
    own = write_jsonl(
        tmp_path / "own.jsonl",
        [{"prompt": f"own {i}?", "completion": f"o{i}"} for i in range(n_self)],
    )
    ref = write_jsonl(
        tmp_path / "ref.jsonl",
        [{"prompt": f"ref {i}?", "answer": str(i), "task": "math"} for i in range(n_ref)]
        + [{"prompt": "ref without answer?", "task": "math"}],
    )
    ingest(lake, ref, "refs")
    general = write_jsonl(tmp_path / "general.jsonl", SFT_ROWS)
    return own, general


def mix_config(own, general, **extra):
    mix = [
        {"pipeline": "self", "weight": 3},
        {"dataset": "refs", "weight": 1},
        {"path": str(general), "weight": 1},
    ]
    return TrainConfig(name="t", base_model="m", data={"path": str(own)}, **({"mix": mix} | extra))


def test_mixed_rows_meet_the_shares_and_record_them(lake, tmp_path):
    own, general = mix_lake(lake, tmp_path)
    cfg = mix_config(own, general)
    ingested = {str(general): ingest(lake, general, "general", preset="sft").prompt_ids}
    rows, record = mixed_rows(cfg, lake, ingested)
    assert len(rows) == 50  # all 30 own rows are 3/5 of the mix
    counts = {r["source"]: r["rows"] for r in record}
    assert counts == {"pipeline:self": 30, "dataset:refs": 10, f"path:{general}": 10}
    assert [r["available"] for r in record] == [30, 40, 3]
    assert [r["repeated"] for r in record] == [0, 0, 7]  # 3 rows give 10: repeated
    assert record[1]["no_response"] == 1
    by_hand = {s: sum(r["mix_source"] == s for r in rows) for s in counts}
    assert by_hand == counts
    assert len({r["prompt_id"] for r in rows if r["mix_source"] == "dataset:refs"}) == 10
    ref = next(r for r in rows if r["mix_source"] == "dataset:refs")
    assert ref["completion"] == ref["messages"][-1]["content"] == ref["prompt"].split()[1][:-1]
    assert mixed_rows(cfg, lake, ingested) == (rows, record)  # seeded

    sized = mix_config(own, general, mix_rows=500)
    rows, record = mixed_rows(sized, lake, ingested)
    assert [r["rows"] for r in record] == [300, 100, 100]

    refused = mix_config(own, general)
    refused.mix[2].on_short = "refuse"
    with pytest.raises(MixError, match=r"path:.*general.jsonl has 3 rows; its share .* needs 10"):
        mixed_rows(refused, lake, ingested)


def test_an_empty_source_is_an_error(lake, tmp_path):
    own, general = mix_lake(lake, tmp_path)
    cfg = TrainConfig(
        name="t",
        base_model="m",
        data={"path": str(own)},
        mix=[{"pipeline": "self", "weight": 1}, {"pipeline": "nobody", "weight": 1}],
    )
    with pytest.raises(MixError, match="pipeline:nobody has no rows"):
        mixed_rows(cfg, lake)


def test_every_source_trains_on_its_answer_tokens_only(lake, tmp_path, tiny_model):
    """Completion-only loss holds for a row of each source kind."""
    from transformers import AutoTokenizer

    from thresher.trainers.data import IGNORE, build_examples, encode

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    own, general = mix_lake(lake, tmp_path)
    cfg = mix_config(own, general)
    ingested = {str(general): ingest(lake, general, "general", preset="sft").prompt_ids}
    rows, _ = mixed_rows(cfg, lake, ingested)
    kinds = {}
    for row in rows:
        kinds.setdefault(row["mix_source"], []).append(row)
    general_rows = {r["completion"]: r for r in kinds[f"path:{general}"]}
    picked = [kinds["pipeline:self"][0], kinds["dataset:refs"][0], *general_rows.values()]
    assert len(picked) == 5  # own, reference, and the three SFT layouts (prompt/response, ...)
    examples, report = build_examples(picked, tokenizer, max_len=128)
    assert report.examples == 5
    for row, ex in zip(picked, examples, strict=True):
        prompt_ids, answer_ids = encode(row, tokenizer)
        n = len(prompt_ids)
        assert ex["labels"][:n] == [IGNORE] * n
        assert ex["labels"][n:] == answer_ids and answer_ids[-1] == tokenizer.eos_token_id
        answer = tokenizer.decode(answer_ids, skip_special_tokens=True).strip()
        assert answer == row["completion"]
        assert row["completion"] not in tokenizer.decode(prompt_ids).split("assistant:")[-1]
    system = general_rows["yes"]["messages"]
    assert system[0] == {"role": "system", "content": "Be brief."}


def test_pipeline_sources_read_all_rounds_or_the_latest(lake, tmp_path):
    from helpers import kept_pipeline

    kept_pipeline(lake, "other", rounds=2, per_round=10)
    own, general = mix_lake(lake, tmp_path)

    def used(rounds):
        cfg = TrainConfig(
            name="t",
            base_model="m",
            data={"path": str(own)},
            mix_rows=100,
            mix=[{"pipeline": "other", "weight": 1, **({"rounds": rounds} if rounds else {})}],
        )
        rows, [record] = mixed_rows(cfg, lake)
        return record["available"], {r["round"] for r in rows}

    assert used(None) == used("all") == (20, {0, 1})
    assert used("latest") == (10, {1})


def test_a_bootstrap_round_trains_on_its_mix_and_without_one_as_before():
    from thresher.config import BootstrapConfig
    from thresher.identities import bootstrap_run_id, fields_of, train_run_id

    base = dict(
        name="b",
        base_model="m",
        prompts={"dataset": "d"},
        eval={"prompts": {"dataset": "d", "split": "eval"}},
    )
    plain = BootstrapConfig(**base)
    assert "mix" not in fields_of(plain, "bootstrap")["train"]
    mix = [{"pipeline": "self", "rounds": "latest", "weight": 4}, {"dataset": "g", "weight": 1}]
    mixed = BootstrapConfig(**base, train={"mix": mix, "mix_rows": 1000})
    step = mixed.train_config(2)
    assert [s.label for s in step.mix] == ["pipeline:self (latest)", "dataset:g"]
    assert step.mix_rows == 1000 and step.data.pipeline == "b" and step.data.round == 2
    assert bootstrap_run_id(mixed) != bootstrap_run_id(plain)
    reweighted = BootstrapConfig(
        **base, train={"mix": [mix[0], {**mix[1], "weight": 2}], "mix_rows": 1000}
    )
    rows = [{"messages": [], "prompt": "p", "completion": "c"}]
    assert train_run_id(reweighted.train_config(2), rows) != train_run_id(step, rows)


def test_the_train_mix_view_and_the_report_show_each_models_mix(lake, tmp_path):
    from helpers import kept_pipeline

    from thresher.evaluators.page import write_report
    from thresher.stores.lake import now
    from thresher.stores.runs import record_run

    kept_pipeline(lake, "b", rounds=1, per_round=10)
    mix = [
        {"source": "pipeline:self", "weight": 2.0, "share": 0.666667, "available": 10,
         "rows": 10, "row_share": 0.666667, "repeated": 0, "on_short": "repeat",
         "no_response": 0},
        {"source": "dataset:g", "weight": 1.0, "share": 0.333333, "available": 2, "rows": 5,
         "row_share": 0.333333, "repeated": 3, "on_short": "repeat", "no_response": 1},
    ]  # fmt: skip
    for run_id, status in (("t1", "completed"), ("t0", "failed")):
        record_run(
            lake,
            run_id,
            flow="train",
            round_=1,
            model="m1",
            config={"name": "b"},
            status=status,
            summary={"mix": mix if run_id == "t1" else mix[:1]},
            started_at=now(),
            finished=True,
        )
    view = lake.query("SELECT * FROM train_mix WHERE run_id = 't1'").to_dicts()
    assert [(v["position"], v["source"], v["rows"], v["repeated"]) for v in view] == [
        (1, "pipeline:self", 10, 0),
        (2, "dataset:g", 5, 3),
    ]
    assert view[1]["pipeline"] == "b" and view[1]["round"] == 1 and view[1]["no_response"] == 1
    page = write_report(lake, tmp_path / "report", "b").read_text()
    assert "<h2>Training mix</h2>" in page
    section = page.split("<h2>Training mix</h2>")[1].split("<h2>")[0]
    assert "dataset:g" in section and section.count("<tr>") == 3  # header + the completed run


def test_sources_outside_selection_are_screened_against_eval_prompts(lake, tmp_path):
    from thresher.config import DecontamConfig
    from thresher.selection.stage import eval_index

    own, _ = mix_lake(lake, tmp_path)
    leaked = "Gus has 9 boxes with 7 pens in each box. How many pens does Gus have in all?"
    held_out = write_jsonl(
        tmp_path / "eval.jsonl", [{"prompt": leaked, "answer": "63", "task": "math"}]
    )
    ingest(lake, held_out, "bench", split="eval")
    rows = [{"prompt": f"Say {w}.", "response": w} for w in ("one", "two", "three")]
    general = write_jsonl(
        tmp_path / "general.jsonl", [*rows, {"prompt": f"Q: {leaked}", "response": "63"}]
    )
    cfg = mix_config(own, general)
    ingested = {str(general): ingest(lake, general, "general", preset="sft").prompt_ids}
    match = eval_index(lake, DecontamConfig()).match
    mixed, record = mixed_rows(cfg, lake, ingested, match)
    assert [r["contaminated"] for r in record] == [0, 0, 1]
    assert record[2]["available"] == 3
    assert not any(leaked in (r["prompt"] or "") for r in mixed)
    unscreened, _ = mixed_rows(cfg, lake, ingested)
    assert any(leaked in (r["prompt"] or "") for r in unscreened)
