"""Dataset presets: read GSM8K, MATH, HumanEval, MBPP, APPS, CodeContests and TACO rows as
they come, turning each dataset's own columns into prompt fields before `normalise`.

Only the standard library is imported here, so the CLI can list the presets in its help.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NoReturn

Record = dict[str, Any]
Derive = Callable[[Record], Any]

PYTHON3 = 3  # CodeContests' Language enum: 0 unknown, 1 PYTHON (2.x), 2 CPP, 3 PYTHON3, 4 JAVA


def _reject(reason: str) -> NoReturn:
    # local: cycle with thresher.ingest.load (and `thresher --help` loads presets, not the lake)
    from thresher.ingest.load import RowError

    raise RowError(reason)


@lru_cache(maxsize=4)  # a row's few JSON cells are parsed once
def _loads(text: str) -> Any:
    return json.loads(text)


def _cell(record: Record, column: str) -> Any:
    """A column's value, with JSON text (APPS, CSV cells) decoded; bad JSON is a reject."""
    value = record.get(column)
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return _loads(value)
        except json.JSONDecodeError as e:
            _reject(f"invalid JSON in '{column}': {e.msg} at column {e.colno}")
    return value


def _text(record: Record, column: str) -> str | None:
    value = record.get(column)
    return value if isinstance(value, str) and value.strip() else None


# -- GSM8K ---------------------------------------------------------------------------


def gsm8k_answer(record: Record) -> str:
    """The text after the final `####` of the worked solution, commas removed."""
    solution = record.get("answer")
    if not isinstance(solution, str):
        _reject("no reference answer: no 'answer' text to take the part after '####' from")
    if "####" not in solution:
        _reject("no reference answer: 'answer' has no '####' line")
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        _reject("no reference answer: nothing after the final '####'")
    return answer


# -- MATH ----------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _braced(text: str, start: int) -> str | None:
    """The content of the `{...}` opening at `start`, braces balanced; None if unclosed."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # \{ \} \\ are characters, not grouping
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} or \\fbox{...} (or `\\boxed 5`) in `text`."""
    found = list(_BOXED.finditer(text))
    if not found:
        return None
    rest = found[-1].end()
    stripped = text[rest:].lstrip()
    if stripped.startswith("{"):
        content = _braced(text, len(text) - len(stripped))
    else:  # `\boxed 5$`: up to the end of the math span
        content = stripped.split("$")[0]
    return content.strip() if content is not None else None


def math_answer(record: Record) -> str:
    """The content of the last boxed answer in `solution`."""
    solution = record.get("solution")
    if not isinstance(solution, str):
        _reject("no boxed answer: no 'solution' text")
    answer = last_boxed(solution)
    if not answer:
        _reject("no boxed answer: 'solution' has no complete \\boxed{...}")
    return answer


# -- HumanEval -----------------------------------------------------------------------


def humaneval_tests(record: Record) -> str:
    """HumanEval's test code (defines `check(candidate)`)."""
    return _text(record, "test") or _reject("no tests: 'test' is missing or blank")


# -- MBPP ----------------------------------------------------------------------------


def _mbpp_text(record: Record) -> Any:
    return record.get("text") if record.get("text") is not None else record.get("prompt")


def _asserts(record: Record, column: str) -> list[str]:
    value = _cell(record, column)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        _reject(f"wrong type: '{column}' must be a list of strings")
    return [t for t in value if t.strip()]


def _statements(code: str) -> list[str]:
    """Top-level statements of setup code, each multi-line statement kept whole."""
    import ast

    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes
        _reject(f"invalid setup code: 'test_setup_code' does not parse ({e})")
    return [ast.get_source_segment(code, node) or "" for node in body]


def mbpp_tests(record: Record) -> list[str]:
    """Setup statements (test_imports, test_setup_code), then the asserts of test_list."""
    asserts = _asserts(record, "test_list")
    if not asserts:
        _reject("no tests: 'test_list' is missing or empty")
    setup = _asserts(record, "test_imports")
    code = record.get("test_setup_code")
    if isinstance(code, str) and code.strip():
        setup += _statements(code.replace("\r\n", "\n"))
    return setup + asserts


def mbpp_prompt(record: Record) -> Any:
    """The task text plus its first test, which names the function (as MBPP harnesses do)."""
    text = _mbpp_text(record)
    tests = _cell(record, "test_list")
    if not isinstance(text, str) or not isinstance(tests, list) or not tests:
        return text
    return f"{text.strip()}\nYour code should pass this test:\n{tests[0]}"


def mbpp_meta(record: Record) -> dict:
    """The reference code, and the challenge tests when there are any."""
    meta = {"reference_solution": record.get("code")}
    challenge = _asserts(record, "challenge_test_list")
    if challenge:
        meta["challenge_test_list"] = challenge
    return meta


# -- APPS / TACO ---------------------------------------------------------------------


def _io(record: Record) -> dict:
    value = _cell(record, "input_output")
    if value in (None, ""):
        _reject("no tests: 'input_output' is missing or empty")
    if not isinstance(value, dict):
        _reject("wrong type: 'input_output' must be an object with 'inputs' and 'outputs'")
    return value


def _fn_name(record: Record) -> str | None:
    try:
        name = _io(record).get("fn_name")
    except ValueError:
        return None
    return name if isinstance(name, str) and name.strip() else None


def apps_prompt(record: Record) -> Any:
    """The question; for call-based problems, the function to write and the starter code."""
    question = record.get("question")
    if not isinstance(question, str):
        return question
    parts = [question.rstrip()]
    fn, starter = _fn_name(record), _text(record, "starter_code")
    if fn:
        parts.append(
            f"Write a Python function `{fn}`: each test calls it with some arguments and "
            "checks the value it returns."
        )
    if starter:
        parts.append(f"Start from this code:\n```python\n{starter.rstrip()}\n```")
    return "\n\n".join(parts)


def _as_text(value: Any, what: str) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)  # APPS' own judge joins line lists the same way
    if not isinstance(value, str):
        _reject(f"wrong type: {what} must be text, got {type(value).__name__}")
    return value


def _stdio_tests(inputs: list, outputs: list, source: str) -> list[dict]:
    return [
        {
            "input": _as_text(i, f"input {n} of {source}"),
            "output": _as_text(o, f"output {n} of {source}"),
        }
        for n, (i, o) in enumerate(zip(inputs, outputs, strict=True), start=1)
    ]


def _call_tests(fn: str, inputs: list, outputs: list) -> list[str]:
    tests = []
    for args, out in zip(inputs, outputs, strict=True):
        args = args if isinstance(args, list) else [args]
        # APPS stores the return value wrapped in a one-element list
        expected = out[0] if isinstance(out, list) and len(out) == 1 else out
        tests.append(f"assert {fn}(*{args!r}) == {expected!r}")
    return tests


def apps_tests(record: Record) -> list:
    """stdin/stdout problems: {input, output} objects; call-based ones: assert strings."""
    io = _io(record)
    inputs, outputs = io.get("inputs"), io.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        _reject("wrong type: 'input_output' needs 'inputs' and 'outputs' lists")
    if len(inputs) != len(outputs):
        _reject(f"wrong type: 'input_output' has {len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        _reject("no tests: 'input_output' has no inputs")
    fn = _fn_name(record)
    if fn is None:
        return _stdio_tests(inputs, outputs, "'input_output'")
    if _is_method(fn, record):
        _reject(
            f"class-based problem: '{fn}' is a method of the starter code's class; "
            "an instance cannot cross the code verifier's referee boundary "
            "(needs isolation: shared)"
        )
    return _call_tests(fn, inputs, outputs)


def _is_method(fn: str, record: Record) -> bool:
    """Whether the starter code (or the first solution) makes `fn` a method of a class."""
    method = re.compile(rf"def\s+{re.escape(fn)}\s*\(\s*self\b")
    sources = [record.get("starter_code"), *_solutions(record)[:1]]
    return any(isinstance(src, str) and method.search(src) for src in sources)


def _solutions(record: Record) -> list:
    value = _cell(record, "solutions")
    return value if isinstance(value, list) else []


def apps_meta(record: Record) -> dict:
    """The first reference solution, the function name and the starter code."""
    solutions = _solutions(record)
    meta: dict[str, Any] = {"n_solutions": len(solutions)}
    if solutions:
        meta["reference_solution"] = solutions[0]
    if _fn_name(record):
        meta["fn_name"] = _fn_name(record)
    if _text(record, "starter_code"):
        meta["starter_code"] = record["starter_code"]
    return meta


# -- CodeContests --------------------------------------------------------------------

CODECONTESTS_SPLITS = ("public_tests", "private_tests")  # generated_tests are left out


def codecontests_tests(record: Record) -> list[dict]:
    """Public then private tests as {input, output} objects."""
    if _text(record, "input_file") or _text(record, "output_file"):
        _reject("file input/output: the program reads or writes a named file, not stdin/stdout")
    tests: list[dict] = []
    for column in CODECONTESTS_SPLITS:
        value = _cell(record, column)
        if value is None:
            continue
        if not isinstance(value, dict):
            _reject(f"wrong type: '{column}' must be an object with 'input' and 'output' lists")
        inputs, outputs = value.get("input") or [], value.get("output") or []
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            _reject(f"wrong type: '{column}' must hold 'input' and 'output' lists")
        if len(inputs) != len(outputs):
            _reject(f"wrong type: '{column}' has {len(inputs)} inputs but {len(outputs)} outputs")
        tests += _stdio_tests(inputs, outputs, f"'{column}'")
    if not tests:
        _reject("no tests: 'public_tests' and 'private_tests' are empty")
    return tests


def _is_python3(language: Any) -> bool:
    return language == PYTHON3 or str(language).upper() == "PYTHON3"


def codecontests_meta(record: Record) -> dict:
    """The first Python 3 solution, when there is one."""
    solutions = _cell(record, "solutions")
    if not isinstance(solutions, dict):
        return {}
    languages, codes = solutions.get("language"), solutions.get("solution")
    if not isinstance(languages, list) or not isinstance(codes, list):
        return {}
    pairs = zip(languages, codes, strict=False)
    first = next((code for lang, code in pairs if _is_python3(lang)), None)
    return {"reference_solution": first} if first is not None else {}


# -- presets -------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    """How one dataset's columns become prompt fields."""

    name: str
    title: str
    task: str
    prompt_from: str  # the column(s) the prompt comes from, for messages
    maps: str  # one line for --help and the README
    fields: dict[str, Derive]
    consumed: frozenset[str]  # columns read; every other column is kept in meta

    def transform(self, record: Record, mapping: dict[str, str]) -> Record:
        """The row as prompt fields; a field named in `mapping` is read from its column."""
        out = {name: self._field(name, record, mapping) for name in ("prompt", "messages")}
        if out["prompt"] is None and out["messages"] is None:
            where = f"'{mapping['prompt']}'" if "prompt" in mapping else self.prompt_from
            _reject(f"missing prompt: no {where} field (preset {self.name})")
        for name in ("task", "answer", "tests", "meta"):
            out[name] = self._field(name, record, mapping)
        if "meta" not in mapping:
            skip = self.consumed | set(mapping.values())
            extra = {k: v for k, v in record.items() if k not in skip and v is not None}
            out["meta"] = {**extra, **{k: v for k, v in out["meta"].items() if v is not None}}
        return out

    def _field(self, name: str, record: Record, mapping: dict[str, str]) -> Any:
        if name in mapping:
            return record.get(mapping[name])
        derive = self.fields.get(name)
        return derive(record) if derive else None


def _prompt(column: str) -> Derive:
    return lambda record: record.get(column)


def _meta(**columns: str) -> Derive:
    return lambda record: {key: record.get(column) for key, column in columns.items()}


def _math_preset(
    name: str, title: str, question: str, solution: str, answer: Derive, maps: str
) -> Preset:
    """A math dataset: `question` -> prompt, `answer` from the row, `solution` -> meta.solution."""
    return Preset(
        name,
        title,
        "math",
        f"'{question}'",
        f"{question} -> prompt; {maps}",
        {"prompt": _prompt(question), "answer": answer, "meta": _meta(solution=solution)},
        frozenset({question, solution}),
    )


_APPS_FIELDS = {"prompt": apps_prompt, "tests": apps_tests, "meta": apps_meta}
_APPS_COLUMNS = frozenset({"question", "solutions", "input_output", "starter_code"})

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _math_preset(
            "gsm8k",
            "GSM8K",
            "question",
            "answer",
            gsm8k_answer,
            "what follows the last #### in answer -> answer; answer -> meta.solution",
        ),
        _math_preset(
            "math",
            "MATH",
            "problem",
            "solution",
            math_answer,
            "the last \\boxed{} in solution -> answer; solution, level, type -> meta",
        ),
        Preset(
            "humaneval",
            "HumanEval",
            "code",
            "'prompt'",
            "prompt -> prompt; test -> tests; entry_point, task_id, canonical_solution -> meta",
            {"prompt": _prompt("prompt"), "tests": humaneval_tests, "meta": _meta()},
            frozenset({"prompt", "test"}),
        ),
        Preset(
            "mbpp",
            "MBPP",
            "code",
            "'text' or 'prompt'",
            "text (or prompt) + its first test -> prompt; test_imports, test_setup_code, "
            "test_list -> tests; code -> meta.reference_solution",
            {"prompt": mbpp_prompt, "tests": mbpp_tests, "meta": mbpp_meta},
            frozenset(
                ("text", "prompt", "code", "test_list", "test_imports", "test_setup_code")
                + ("challenge_test_list",)
            ),
        ),
        Preset(
            "apps",
            "APPS",
            "code",
            "'question'",
            "question (+ starter_code, fn_name) -> prompt; input_output -> tests "
            "({input, output} list, or asserts when fn_name is set); solutions[0] -> "
            "meta.reference_solution",
            _APPS_FIELDS,
            _APPS_COLUMNS,
        ),
        Preset(
            "codecontests",
            "CodeContests",
            "code",
            "'description'",
            "description -> prompt; public_tests + private_tests -> tests ({input, output} "
            "list); first Python 3 solution -> meta.reference_solution",
            {
                "prompt": _prompt("description"),
                "tests": codecontests_tests,
                "meta": codecontests_meta,
            },
            frozenset(
                ("description", "public_tests", "private_tests", "generated_tests")
                + ("solutions", "incorrect_solutions")
            ),
        ),
        Preset(
            "taco",
            "TACO",
            "code",
            "'question'",
            "as apps (same layout)",
            _APPS_FIELDS,
            _APPS_COLUMNS,
        ),
    )
}

# -- general SFT data (a training mix's `path` source) -------------------------------


def _sft_turns(record: Record) -> tuple[list | None, str | None]:
    """(the prompt's messages, the response) of a `messages` row: the last turn must be
    the assistant's, and it is the response."""
    messages = _cell(record, "messages")
    if messages is None:
        return None, None
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        _reject("wrong type: 'messages' must be a list of {role, content} objects")
    last = messages[-1]
    if last.get("role") != "assistant":
        _reject("missing response: the last message is not the assistant's")
    if len(messages) < 2:
        _reject("missing prompt: 'messages' holds only the assistant's answer")
    return messages[:-1], last.get("content")


def sft_response(record: Record) -> str:
    """The response: `response`, `completion`, or the last (assistant) message."""
    for column in ("response", "completion"):
        if record.get(column) is not None:
            value = record[column]
            break
    else:
        value = _sft_turns(record)[1]
    if value is None:
        _reject("missing response: no 'response', 'completion' or final assistant message")
    if not isinstance(value, str):
        _reject(f"wrong type: the response must be a string, got {type(value).__name__}")
    if not value.strip():
        _reject("empty response")
    return value


PRESETS["sft"] = Preset(
    "sft",
    "SFT data",
    "sft",
    "'prompt' or 'messages'",
    "prompt + response (or completion) -> prompt + answer; messages: all but the last "
    "(assistant) turn -> messages, that turn -> answer",
    {
        "prompt": _prompt("prompt"),
        "messages": lambda record: _sft_turns(record)[0],
        "answer": sft_response,
        "meta": lambda record: {},
    },
    frozenset({"prompt", "messages", "response", "completion"}),
)

ALIASES = {
    "gsm_8k": "gsm8k",
    "competition_math": "math",
    "hendrycks_math": "math",
    "math500": "math",
    "math_500": "math",
    "human_eval": "humaneval",
    "openai_humaneval": "humaneval",
    "mbpp_sanitized": "mbpp",
    "code_contests": "codecontests",
}


def find_preset(name: str) -> Preset | None:
    """The preset called `name`, an alias, or a Hub id such as openai/gsm8k or BAAI/TACO."""
    key = name.strip().lower().rsplit("/", 1)[-1].replace("-", "_")
    return PRESETS.get(ALIASES.get(key, key))


def help_lines() -> list[str]:
    """One line per preset: its name, task and what it maps."""
    return [f"{p.name} ({p.task}): {p.maps}" for p in PRESETS.values()]


# -- guessing the preset of a file that was ingested without one --------------------

_PROMPT_COLUMNS = ("question", "problem", "text", "description", "instruction", "query")


def detect(record: Record) -> Preset | None:
    """The preset whose columns this row has, if any."""
    has = {k for k, v in record.items() if v is not None}
    answer = record.get("answer")
    if {"question", "input_output"} <= has:
        return PRESETS["taco" if has & {"skill_types", "raw_tags"} else "apps"]
    if {"description", "public_tests"} <= has:
        return PRESETS["codecontests"]
    if {"question", "answer"} <= has and isinstance(answer, str) and "####" in answer:
        return PRESETS["gsm8k"]
    if {"problem", "solution"} <= has:
        return PRESETS["math"]
    if {"prompt", "test", "entry_point"} <= has:
        return PRESETS["humaneval"]
    if "test_list" in has and has & {"text", "prompt"}:
        return PRESETS["mbpp"]
    return None


def suggest(record: Record, missing: str) -> str | None:
    """A hint for a row rejected for a missing `prompt` or `task`, from its columns."""
    preset = detect(record)
    if preset is None:
        if missing != "prompt":
            return None
        column = next((c for c in _PROMPT_COLUMNS if isinstance(record.get(c), str)), None)
        return f"try --map prompt={column}" if column else None
    column = next((c for c in ("question", "problem", "text", "description") if c in record), None)
    alternative = f", or --map prompt={column}" if missing == "prompt" and column else ""
    return f"this looks like {preset.title}: try --preset {preset.name}{alternative}"
