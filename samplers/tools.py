"""Candidates that call a code tool (`sampling.tools`): generation stops at the end of a
code block, the code runs in the code verifier's sandbox, its output is appended, and the
model goes on, every candidate of a batch one step at a time.

A step is one engine call for every candidate still running; a candidate's next request is
its prompt plus its text so far, so the engine's prefix cache holds the shared part. Each
candidate keeps its segments: the model's text, its code blocks, and the tool's outputs
(what the environment wrote: context, never a training target)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from thresher.config import ToolsConfig
from thresher.samplers.vllm_offline import Completion, lora_request
from thresher.sandbox import Limits
from thresher.sandbox import run_code as run_in_sandbox


@dataclass(frozen=True)
class Step:
    """One engine request: prompt `prompt` continued from `prefix`, `n` samples."""

    prompt: int
    prefix: str
    n: int
    stop: list[str]
    max_tokens: int
    max_context: int | None = None  # most tokens prompt + prefix + new text may reach


@dataclass(frozen=True)
class StepOut:
    """What one request sampled: text, its tokens, and why it ended.

    `finish_reason` is stop, length, or budget (no room left in the engine's context)."""

    text: str
    n_tokens: int
    finish_reason: str
    context_tokens: int | None = None  # prompt + prefix as the engine tokenized them


StepFn = Callable[[list[Step]], list[list[StepOut]]]
RunCode = Callable[[list[str]], list[Any]]  # codes -> sandbox.ToolRun each


@dataclass
class _Candidate:
    prompt: int
    segments: list[dict] = field(default_factory=list)
    tokens: int = 0  # the model's own
    calls: int = 0
    in_code: bool = False
    done: str | None = None  # the finish reason once it ends
    prompt_tokens: int | None = None
    context: int = 0  # tokens after the prompt, tool output included (as last counted)

    @property
    def text(self) -> str:
        return "".join(s["text"] for s in self.segments)

    def add(self, kind: str, text: str) -> None:
        if text and self.segments and self.segments[-1]["kind"] == kind and kind != "output":
            self.segments[-1]["text"] += text
        elif text:
            self.segments.append({"kind": kind, "text": text})


def tool_output(run: Any, limit: int) -> str:
    """What the model is shown of one run: its stdout, then its error as the interpreter
    printed it (or why it was stopped), cut to `limit` characters."""
    text = run.stdout
    if run.error:
        err = run.stderr.strip() or run.error
        if run.status == "timeout":
            err = f"TimeoutError: {run.error}"
        text = (text.rstrip("\n") + "\n" if text.strip() else "") + err
    text = text.rstrip("\n")
    if len(text) > limit:
        cut = len(text) - limit
        text = text[:limit] + f"\n[... {cut} more characters]"
    return text


def sample_with_tools(
    step: StepFn,
    n_prompts: int,
    k: int,
    tools: ToolsConfig,
    *,
    max_tokens: int,
    stop: Sequence[str] = (),
    run_code: RunCode | None = None,
    eos_stops: bool = True,
) -> list[list[Completion]]:
    """k candidates for each of `n_prompts` prompts, each calling the tool up to
    `tools.max_calls` times; `step` samples, `run_code` runs code (default: the sandbox)."""
    if run_code is None:
        run_code = sandbox_runner(tools)
    text_stop = [*stop, tools.open]
    cands: list[_Candidate] = []
    first = step([Step(p, "", k, text_stop, max_tokens) for p in range(n_prompts)])
    for p, outs in enumerate(first):
        for out in outs:
            c = _Candidate(p)
            cands.append(c)
            _advance(c, out, tools, max_tokens)
    while True:
        _run_pending(cands, tools, run_code)
        running = [c for c in cands if c.done is None]
        if not running:
            break
        requests = []
        for c in running:
            left = max_tokens - c.tokens
            if tools.max_total_tokens is not None:
                left = min(left, tools.max_total_tokens - c.context)
            stops = [tools.close] if c.in_code else text_stop
            cap = None
            if tools.max_total_tokens is not None and c.prompt_tokens is not None:
                cap = c.prompt_tokens + tools.max_total_tokens
            requests.append(Step(c.prompt, c.text, 1, stops, max(left, 1), cap))
        for c, outs in zip(running, step(requests), strict=True):
            _advance(c, outs[0], tools, max_tokens)
    by_prompt: list[list[Completion]] = [[] for _ in range(n_prompts)]
    for c in cands:
        by_prompt[c.prompt].append(
            Completion(c.text, c.tokens, c.done or "stop", segments=tuple(c.segments))
        )
    return by_prompt


def _advance(c: _Candidate, out: StepOut, tools: ToolsConfig, max_tokens: int) -> None:
    """Take one step's output into the candidate: where it is now, and whether it ended."""
    c.tokens += out.n_tokens
    if out.context_tokens is not None:
        if c.prompt_tokens is None:
            c.prompt_tokens = out.context_tokens
        c.context = out.context_tokens - c.prompt_tokens + out.n_tokens
    else:
        c.context += out.n_tokens
    text = out.text
    if out.finish_reason == "budget":
        c.add("code" if c.in_code else "text", text)
        c.done = "budget"
        return
    if c.in_code:
        c.add("code", text)
        if out.finish_reason == "stop" and text.endswith(tools.close):
            c.segments[-1]["pending"] = True  # run before the next step
        else:
            c.done = out.finish_reason  # the model ended inside its code block
    elif out.finish_reason == "stop" and text.endswith(tools.open):
        c.add("text", text[: -len(tools.open)])
        if c.calls >= tools.max_calls:
            c.done = "max_calls"  # it asked for one run more than it may have
            return
        c.segments.append({"kind": "code", "text": tools.open})
        c.in_code = True
    else:
        c.add("text", text)
        c.done = out.finish_reason
    if c.done is None and c.tokens >= max_tokens:
        c.done = "length"
    elif c.done is None and tools.max_total_tokens and c.context >= tools.max_total_tokens:
        c.done = "budget"


def _run_pending(cands: list[_Candidate], tools: ToolsConfig, run_code: RunCode) -> None:
    """Run every closed code block of this step at once and append each one's output."""
    pending = [c for c in cands if c.segments and c.segments[-1].pop("pending", False)]
    if not pending:
        return
    codes = [_code(c.segments[-1]["text"], tools) for c in pending]
    runs = run_code(codes)
    for c, code, run in zip(pending, codes, runs, strict=True):
        c.segments[-1]["code"] = code
        shown = tool_output(run, tools.output_chars)
        c.segments.append(
            {
                "kind": "output",
                "text": tools.output.replace("{output}", shown),
                "output": shown,
                "status": run.status,
                "ms": round(run.elapsed_ms, 3),
            }
        )
        c.calls += 1
        c.in_code = False


def _code(block: str, tools: ToolsConfig) -> str:
    """The code inside a block (its opening and closing markers off)."""
    body = block[len(tools.open) : len(block) - len(tools.close)]
    return body.strip("\n")


def sandbox_runner(tools: ToolsConfig) -> RunCode:
    """Run codes in the code verifier's sandbox with the tool's limits."""
    limits = Limits(
        timeout_s=tools.timeout_s,
        cpu_s=int(tools.timeout_s + 0.999) + 1,  # the wall limit should stop a loop first
        memory_mb=tools.memory_mb,
        output_mb=max(tools.output_chars * 4 / 2**20, 0.01),
    )
    return lambda codes: run_in_sandbox(codes, limits, tools.workers)


# -- the step on this process's vLLM engine --------------------------------------------


def engine_step(llm: Any, rendered: list[str], sampling: dict[str, Any], lora: str | None):
    """A `StepFn` on a vLLM engine: each request's prompt is its rendered prompt plus its
    prefix; a request that leaves no room in the context ends with `budget`."""
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    limit = llm.llm_engine.model_config.max_model_len
    request = lora_request(lora) if lora else None

    def step(requests: list[Step]) -> list[list[StepOut]]:
        texts = [rendered[r.prompt] + r.prefix for r in requests]
        # a prefix is not always tokenized as it was sampled: count it as the engine will
        counts = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        outs: list[list[StepOut] | None] = [None] * len(requests)
        todo, params = [], []
        for i, (r, n) in enumerate(zip(requests, counts, strict=True)):
            room = min(r.max_tokens, limit - n, (r.max_context or limit) - n)
            if room < 1:
                outs[i] = [StepOut("", 0, "budget", n)] * r.n
                continue
            todo.append(i)
            params.append(
                SamplingParams(
                    n=r.n,
                    temperature=sampling["temperature"],
                    top_p=sampling["top_p"],
                    top_k=sampling["top_k"],
                    max_tokens=room,
                    stop=r.stop,
                    include_stop_str_in_output=True,
                )
            )
        if todo:
            got = llm.generate(
                [texts[i] for i in todo], params, use_tqdm=False, lora_request=request
            )
            for i, o in zip(todo, got, strict=True):
                r = requests[i]
                room = min(r.max_tokens, limit - counts[i], (r.max_context or limit) - counts[i])
                outs[i] = [
                    StepOut(
                        c.text,
                        len(c.token_ids),
                        _finish(c.finish_reason, len(c.token_ids), room, r.max_tokens),
                        len(o.prompt_token_ids or []) or counts[i],
                    )
                    for c in sorted(o.outputs, key=lambda c: c.index)
                ]
        return outs  # type: ignore[return-value]

    return step


def _finish(reason: str | None, n: int, room: int, asked: int) -> str:
    if reason == "length":
        return "budget" if room < asked and n >= room else "length"
    return "stop"
