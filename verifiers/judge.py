"""The `judge` verifier: a model says whether a candidate's final answer matches the reference."""

from __future__ import annotations

import json
import os
import re
import string
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from pydantic import Field, field_validator

from thresher.config import SamplingConfig, ServerConfig
from thresher.samplers.engines import sampler_at
from thresher.samplers.vllm_offline import render_prompts
from thresher.verifiers.base import Verdict, Verifier, quote, verdict_frame
from thresher.verifiers.extract import extract_answer

if TYPE_CHECKING:
    from thresher.config import EngineStage

DEFAULT_TEMPLATE = """\
You are checking a student's final answer against the reference answer of a problem.

Problem:
{prompt}

Reference answer: {reference}
Student's final answer: {answer}

Is the student's final answer equivalent to the reference answer? \
Reply with one word: yes or no."""

FIELDS = ("prompt", "reference", "answer")
NO_REFERENCE = "no reference answer for this prompt"
NO_ANSWER = "no final answer found"
ENGINE_OPTIONS = {"seed", "dtype", "max_model_len", "gpu_memory_utilization", "enforce_eager"}
ENGINE_OPTIONS |= {"extra"}
_WORDS = re.compile(r"[^\W_]+")  # letters and digits: quotes, '*', '_' and punctuation split


def check_template(template: str) -> str:
    """`template` if it has exactly the {prompt}, {reference} and {answer} fields, else
    ValueError saying what is wrong."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"judge template is not a format string: {e}") from None
    missing = [f for f in FIELDS if f not in fields]
    if missing:
        names = ", ".join("{" + f + "}" for f in missing)
        raise ValueError(f"judge template lacks the placeholder(s) {names}")
    unknown = sorted({f for f in fields if f not in FIELDS})
    if unknown:
        names = ", ".join("{" + f + "}" for f in unknown)
        raise ValueError(
            f"judge template has unknown placeholder(s) {names}: only {{prompt}}, "
            "{reference} and {answer} are filled (write literal braces as {{ and }})"
        )
    return template


def judge_prompt(template: str, prompt: str, reference: str, answer: str) -> str:
    """The question put to the judge model: the template filled in."""
    return template.format(prompt=prompt, reference=reference, answer=answer)


def question(prompt: str | None, messages: str | list | None) -> str:
    """The prompt's text: `prompt`, else the last user message of `messages` (JSON or list)."""
    if prompt:
        return prompt
    msgs = json.loads(messages) if isinstance(messages, str) else (messages or [])
    users = [m.get("content") or "" for m in msgs if m.get("role") == "user"]
    return users[-1] if users else ""


def parse_reply(text: str | None) -> bool | None:
    """True for a reply whose first word is yes, False for no (any case, after spaces,
    quotes, punctuation or markdown); None when it starts otherwise or also says the other
    word (e.g. 'yes/no')."""
    words = _WORDS.findall((text or "").lower())
    if not words or words[0] not in ("yes", "no"):
        return None
    other = "no" if words[0] == "yes" else "yes"
    return None if other in words else words[0] == "yes"


def reply_verdict(reply: str, answer: str, reference: str) -> Verdict:
    """The verdict a judge's reply gives: pass on yes, fail on no or anything else."""
    said = parse_reply(reply)
    if said is None:
        return Verdict(
            0.0,
            False,
            f"judge reply {quote(reply)} is neither yes nor no "
            f"(answer {quote(answer)}, reference {quote(reference)})",
        )
    if said:
        return Verdict(
            1.0,
            True,
            f"judge said yes: {quote(answer)} matches reference {quote(reference)} "
            f"(reply {quote(reply)})",
        )
    return Verdict(
        0.0,
        False,
        f"judge said no: {quote(answer)} does not match reference {quote(reference)} "
        f"(reply {quote(reply)})",
    )


class Judge(Verifier):
    """Ask a model whether a candidate's final answer matches the prompt's reference answer.

    Where the model runs (the samplers' `sampler_at` makes the sampler), one of:
    - `model`: a local model folder, run by this process's vLLM engine. A running engine
      that serves that model is reused (whatever its other settings, a sampling engine
      included) and left running; otherwise the judge starts one (`engine`: get_engine's
      settings, e.g. max_model_len, gpu_memory_utilization), replacing an engine of
      another model, and shuts it down when run() ends, as the device slot around it ends
      (run(batch, keep=True) keeps it for the next call). A judge model other than the
      sampling model's is best served with `server`, so neither engine restarts per batch.
    - `server`: the base URL of an OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1)
      with `served_model` naming its model; `api_key_env` names the environment variable
      that holds its key. Requests go to /chat/completions (/completions without `chat`).

    The template's {prompt}, {reference} and {answer} are filled with the prompt's text,
    its reference answer and the candidate's extracted final answer; it is sent as one
    user message, through the model's chat template when it has one (`chat`), decoded
    greedily for at most `max_tokens` tokens. A reply starting with yes passes (score 1);
    no, anything else, a missing reference or final answer, or a judge prompt too long
    for a local model fails, with the reply quoted in the reason.
    """

    name = "judge"
    uses_reference = True
    version = 2  # 2: the answer shown is found as the rule verifiers find it ("X is the answer")
    uses_device = True
    ranks = False
    # a request that fails after its retries fails the batch, never a verdict
    operational = frozenset({"concurrency", "timeout_s", "retries", "api_key_env"})

    class Options(Verifier.Options):
        model: str | None = Field(None, description="a local model folder (the sampling model)")
        server: str | None = Field(None, description="an OpenAI-compatible server's base URL")
        template: str = Field(DEFAULT_TEMPLATE, description="with {prompt}, {reference}, {answer}")
        max_tokens: int = Field(8, ge=1, description="of the reply")
        served_model: str | None = Field(None, description="the model `server` serves")
        api_key_env: str | None = Field(None, description="the variable holding server's key")
        chat: bool = Field(True, description="ask through the model's chat template")
        engine: dict[str, Any] | None = Field(None, description="a local engine's settings")
        concurrency: int = Field(16, ge=1, description="requests to the server at once")
        timeout_s: float = Field(120.0, gt=0, description="one request")
        retries: int = Field(3, ge=0, description="of a failed request")

        @field_validator("template")
        @classmethod
        def _fields(cls, template: str) -> str:
            return check_template(template)

        @field_validator("engine")
        @classmethod
        def _engine(cls, engine: dict[str, Any] | None) -> dict[str, Any] | None:
            unknown = sorted(set(engine or {}) - ENGINE_OPTIONS)
            if unknown:
                raise ValueError(f"unknown setting(s) {unknown}; known: {sorted(ENGINE_OPTIONS)}")
            return engine

    @classmethod
    def check_config(cls, options: Judge.Options, config: EngineStage) -> None:
        """A local judge model runs on the process's one engine: it must be the sampling
        model, else every batch would swap engines (a minute each); a judge of another model
        belongs on a server (judge.server)."""
        if options.server or not options.model:
            return
        same = Path(options.model).resolve() == Path(config.model).resolve()
        if config.placement != "local" or not same:
            raise ValueError(
                "a local judge model shares this process's one engine with sampling, so it "
                "must be the model that samples with a local engine; serve the judge model "
                "(e.g. `vllm serve`) and set verify.options.judge.server and served_model "
                "instead"
            )

    def __init__(
        self,
        model: str | None = None,
        server: str | None = None,
        template: str = DEFAULT_TEMPLATE,
        max_tokens: int = 8,
        served_model: str | None = None,
        api_key_env: str | None = None,
        chat: bool = True,
        engine: dict[str, Any] | None = None,
        concurrency: int = 16,
        timeout_s: float = 120.0,
        retries: int = 3,
    ):
        if model and server:
            raise ValueError(
                "judge takes `model` (a local model folder) or `server` (an OpenAI-compatible "
                "base URL, with `served_model`), not both"
            )
        if not model and not server:
            raise ValueError(
                "judge needs `model` (a local model folder) or `server` (an OpenAI-compatible "
                "base URL, with `served_model`)"
            )
        model = os.path.expanduser(model) if model else model
        if model and not Path(model).is_dir():
            raise ValueError(f"judge model folder not found: {model}")
        if server and not served_model:
            raise ValueError("judge with `server` needs `served_model`: the model it serves")
        if served_model and not server:
            raise ValueError("judge `served_model` goes with `server`; a local model is `model`")
        if not server and api_key_env:
            raise ValueError("judge `api_key_env` goes with `server`")
        if api_key_env and not os.environ.get(api_key_env):
            raise ValueError(f"judge api_key_env: ${api_key_env} is not set")
        if engine and server:
            raise ValueError("judge `engine` settings go with a local `model`, not `server`")
        unknown = sorted(set(engine or {}) - ENGINE_OPTIONS)
        if unknown:
            raise ValueError(
                f"judge engine: unknown setting(s) {unknown}; known: {sorted(ENGINE_OPTIONS)}"
            )
        if max_tokens < 1:
            raise ValueError(f"judge max_tokens must be at least 1, not {max_tokens}")
        self.model, self.server, self.served_model = model, server, served_model
        self.template = check_template(template)
        self.max_tokens = max_tokens
        self.api_key_env = api_key_env
        self.chat = chat
        self.engine = dict(engine or {})
        self.concurrency, self.timeout_s, self.retries = concurrency, timeout_s, retries

    def prepare(self, row: dict) -> tuple[str, str, str] | Verdict:
        """(judge prompt, final answer, reference) for a row, or the verdict of a row the
        model need not see."""
        reference = row.get("answer")
        if reference is None or not str(reference).strip():
            return Verdict(0.0, False, NO_REFERENCE)
        answer, _ = extract_answer(row.get("text") or "")
        if answer is None:
            return Verdict(0.0, False, NO_ANSWER)
        prompt = question(row.get("prompt"), row.get("messages"))
        return judge_prompt(self.template, prompt, str(reference), answer), answer, str(reference)

    def engine_prompts(self, llm, texts: list[str]) -> list[str]:
        """What the local engine is given for these judge prompts: each as one user message
        through the model's chat template (the text itself without `chat`)."""
        if not self.chat:
            return list(texts)

        messages = [[{"role": "user", "content": t}] for t in texts]
        return render_prompts(llm, [None] * len(texts), messages)

    def sampler(self):
        """What the judge asks: the samplers' own choice of a server or this process's
        engine (shared with sampling when it serves the same model), greedy."""
        greedy = SamplingConfig(
            k=1, temperature=0.0, top_p=1.0, top_k=0, max_tokens=self.max_tokens, chat=self.chat
        )
        server = self.server and ServerConfig(
            base_url=self.server,
            concurrency=self.concurrency,
            retries=self.retries,
            timeout_s=self.timeout_s,
            api_key_env=self.api_key_env,
            vllm_extensions=False,  # plain OpenAI parameters: any compatible server
        )
        return sampler_at(self.served_model or self.model, greedy, server or None, self.engine)

    def ask(self, texts: list[str], keep: bool = False) -> tuple[list[str | Verdict], float]:
        """The model's replies to these judge prompts, in one batched call, and the seconds
        they took (a local engine's start not counted); a prompt too long for the model
        gets a failing verdict instead (`keep`: an engine the judge started stays up)."""
        sampler = self.sampler()
        was_up = sampler.is_up()
        none = [None] * len(texts)
        try:
            over = sampler.too_long(texts, none)  # starts a local engine
            out: list[str | Verdict] = [
                Verdict(
                    0.0,
                    False,
                    f"judge prompt is {o[0]} tokens: with max_tokens {self.max_tokens} "
                    f"it exceeds the judge model's limit of {o[1]}",
                )
                if o
                else t
                for o, t in zip(over, texts, strict=True)
            ]
            todo = [t for t in out if isinstance(t, str)]
            start = time.perf_counter()
            outs = sampler.sample(todo, [None] * len(todo), 1) if todo else []
            replies = iter(c[0].text for c in outs)
            seconds = time.perf_counter() - start
            return [next(replies) if isinstance(t, str) else t for t in out], seconds
        finally:
            if not was_up and not keep:
                sampler.close()

    def run(self, batch: pl.DataFrame, keep: bool = False) -> pl.DataFrame:
        """One verdict per candidate; only rows with a reference and a final answer are
        asked, in one batched call (`keep`: a local engine the judge started stays up)."""
        rows = batch.to_dicts()
        verdicts: list[Verdict | None] = [None] * len(rows)
        elapsed = [0.0] * len(rows)
        asked: list[tuple[int, str, str, str]] = []
        for i, row in enumerate(rows):
            start = time.perf_counter()
            prepared = self.prepare(row)
            elapsed[i] = (time.perf_counter() - start) * 1000
            if isinstance(prepared, Verdict):
                verdicts[i] = prepared
            else:
                asked.append((i, *prepared))
        if asked:
            replies, seconds = self.ask([text for _, text, _, _ in asked], keep=keep)
            for (i, _, answer, reference), reply in zip(asked, replies, strict=True):
                verdicts[i] = (
                    reply if isinstance(reply, Verdict) else reply_verdict(reply, answer, reference)
                )
                elapsed[i] += seconds * 1000 / len(asked)
        done = [v for v in verdicts if v is not None]
        return verdict_frame(self.name, batch["candidate_id"].to_list(), done, elapsed)
