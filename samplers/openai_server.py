"""Sample k candidates per prompt from an OpenAI-compatible server (for example `vllm serve`)."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from thresher.samplers.tools import Step, StepOut
from thresher.samplers.vllm_offline import Completion


class ServerError(RuntimeError):
    """The server refused a request (4xx), or kept failing after every retry.

    `retryable` says whether trying again later may help (failures after every retry:
    the server was down or overloaded); a refusal or a malformed answer will not change.
    """

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


RETRY_STATUS = {408, 409, 425, 429}  # retried like 5xx: timeouts, conflicts, rate limits


async def _post(client, url: str, body: dict, *, retries: int, backoff: float) -> dict:
    import httpx

    for attempt in range(retries + 1):
        try:
            response = await client.post(url, json=body)
        except (httpx.TransportError, httpx.TimeoutException) as e:
            problem = f"{type(e).__name__}: {e}"
        else:
            code = response.status_code
            if code < 400:
                return response.json()
            if code < 500 and code not in RETRY_STATUS:
                raise ServerError(f"{url} refused the request ({code}): {response.text[:500]}")
            problem = f"HTTP {code}: {response.text[:200]}"
        if attempt == retries:
            raise ServerError(
                f"{url} failed after {retries + 1} attempts; last error: {problem}", retryable=True
            )
        delay = backoff * 2**attempt
        await asyncio.sleep(delay * (0.5 + random.random()))  # jitter spreads the retries
    raise AssertionError("unreachable")


def _choices(payload: dict, k: int, chat: bool) -> list[Completion]:
    out = []
    for choice in sorted(payload.get("choices", []), key=lambda c: c.get("index", 0)):
        text = (choice["message"].get("content") or "") if chat else choice.get("text", "")
        ids = choice.get("token_ids")
        n_tokens = len(ids) if ids is not None else None
        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        out.append(Completion(text, n_tokens, reason))
    if len(out) != k:
        raise ServerError(f"asked for n={k} completions, the server returned {len(out)}")
    return out


async def _sample_all(
    base_url: str,
    model: str,
    prompts: list[str | None],
    messages: list[Any],
    body: dict,
    k: int,
    concurrency: int,
    retries: int,
    backoff: float,
    timeout: float,
    api_key: str | None,
) -> list[list[Completion]]:
    import httpx

    limit = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = base_url.rstrip("/")

    async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:

        async def one(prompt: str | None, msgs: Any) -> list[Completion]:
            chat = msgs is not None
            request = {**body, "model": model, "n": k}
            if chat:
                request["messages"] = json.loads(msgs) if isinstance(msgs, str) else msgs
                url = f"{base}/chat/completions"
            else:
                request["prompt"] = prompt
                url = f"{base}/completions"
            async with limit:
                payload = await _post(client, url, request, retries=retries, backoff=backoff)
            return _choices(payload, k, chat)

        return await asyncio.gather(*(one(p, m) for p, m in zip(prompts, messages, strict=True)))


def sample_server(
    base_url: str,
    model: str,
    prompts: list[str | None],
    messages: list[Any],
    *,
    k: int,
    temperature: float,
    top_p: float,
    top_k: int = 0,
    max_tokens: int,
    stop: list[str] | None = None,
    concurrency: int = 16,
    retries: int = 5,
    backoff: float = 0.5,
    timeout: float = 600.0,
    api_key: str | None = None,
    vllm_extensions: bool = True,
) -> list[list[Completion]]:
    """k completions per prompt (one request each, n=k), at most `concurrency` in flight.

    Chat prompts (`messages`) go to /chat/completions, plain prompts to /completions.
    Connection errors, timeouts, 429 and 5xx are retried with exponential backoff;
    other 4xx answers raise ServerError at once. With `vllm_extensions`, vLLM's
    `return_token_ids` (for n_tokens) and `top_k` are sent too.
    """
    body: dict[str, Any] = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
    if stop:
        body["stop"] = stop
    if vllm_extensions:
        body["return_token_ids"] = True
        if stop:  # as the local engine does: the stop string stays part of the answer
            body["include_stop_str_in_output"] = True
        if top_k:
            body["top_k"] = top_k
    return asyncio.run(
        _sample_all(
            base_url,
            model,
            prompts,
            messages,
            body,
            k,
            concurrency,
            retries,
            backoff,
            timeout,
            api_key,
        )
    )


def server_step(
    base_url: str,
    model: str,
    prompts: list[str | None],
    messages: list[Any],
    *,
    temperature: float,
    top_p: float,
    top_k: int = 0,
    concurrency: int = 16,
    retries: int = 5,
    backoff: float = 0.5,
    timeout: float = 600.0,
    api_key: str | None = None,
    vllm_extensions: bool = True,
    **_: Any,
):
    """A tool loop's `StepFn` on a server: a chat prompt goes on from its text so far as
    the assistant's unfinished turn (vLLM's `continue_final_message`), a plain one as its
    prompt plus that text."""
    base = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def run(requests: list[Step]) -> list[list[StepOut]]:
        import httpx

        limit = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:

            async def one(r: Step) -> list[StepOut]:
                body: dict[str, Any] = {
                    "model": model,
                    "n": r.n,
                    "temperature": temperature,
                    "top_p": top_p,
                    "max_tokens": r.max_tokens,
                    "stop": r.stop,
                }
                if vllm_extensions:
                    body |= {"return_token_ids": True, "include_stop_str_in_output": True}
                    if top_k:
                        body["top_k"] = top_k
                msgs = messages[r.prompt]
                if msgs is not None:
                    msgs = json.loads(msgs) if isinstance(msgs, str) else list(msgs)
                    if r.prefix:
                        msgs = [*msgs, {"role": "assistant", "content": r.prefix}]
                        body |= {"continue_final_message": True, "add_generation_prompt": False}
                    body["messages"], url = msgs, f"{base}/chat/completions"
                else:
                    body["prompt"], url = (
                        (prompts[r.prompt] or "") + r.prefix,
                        f"{base}/completions",
                    )
                async with limit:
                    payload = await _post(client, url, body, retries=retries, backoff=backoff)
                got = _choices(payload, r.n, msgs is not None)
                context = (payload.get("usage") or {}).get("prompt_tokens")
                return [StepOut(c.text, c.n_tokens or 0, c.finish_reason, context) for c in got]

            return list(await asyncio.gather(*(one(r) for r in requests)))

    return lambda requests: asyncio.run(run(requests))
