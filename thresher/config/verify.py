"""The verify section: which verifiers score candidates and which verdicts make them pass."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from thresher.config.base import _Strict


class VerifyConfig(_Strict):
    """Which verifiers score the candidates, and which verdicts make a candidate pass."""

    counted_at_default = frozenset({"verifiers", "by_task", "options", "rule"})

    verifiers: list[str] = Field(
        default_factory=lambda: ["exact"],
        min_length=1,
        description="verifiers for every prompt (unless by_task names its task)",
    )
    by_task: dict[str, list[str]] = Field(
        default_factory=dict, description="task -> verifiers for prompts of that task"
    )
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="verifier -> its options, e.g. code: {timeout_s: 5}"
    )
    rule: str | None = Field(
        None, description='e.g. "math and format"; default: every verdict passed'
    )

    @model_validator(mode="after")
    def _known_names(self) -> VerifyConfig:
        from thresher.rules import rule_names
        from thresher.verifiers import registry, verifier_name

        known = set(registry())
        used = set(self.verifiers) | {n for names in self.by_task.values() for n in names}
        # `module.path:ClassName` names a user's verifier, imported here
        unknown = {n for n in used | set(self.options) if n not in known and ":" not in n}
        if unknown:
            raise ValueError(
                f"unknown verifier(s) {sorted(unknown)}; known: {', '.join(sorted(known))}"
            )
        imported = {n for n in used | set(self.options) if ":" in n}
        if imported:
            # from here on it goes by its class's `name`, as in rules and verdict rows
            try:
                named = {n: verifier_name(n) for n in imported}
            except KeyError as e:
                raise ValueError(e.args[0]) from None

            def canonical(names: list[str]) -> list[str]:
                return list(dict.fromkeys(named.get(n, n) for n in names))

            self.verifiers = canonical(self.verifiers)
            self.by_task = {task: canonical(names) for task, names in self.by_task.items()}
            options: dict[str, dict[str, Any]] = {}
            for n, opts in self.options.items():
                if named.get(n, n) in options:
                    raise ValueError(f"options for verifier {named.get(n, n)!r} given twice")
                options[named.get(n, n)] = opts
            self.options = options
            used = {named.get(n, n) for n in used}
        if self.rule:
            missing = rule_names(self.rule) - used
            if missing:
                raise ValueError(f"rule names verifiers that never run: {sorted(missing)}")
        return self

    def with_reference(self) -> VerifyConfig:
        """These settings less the verifiers that judge without a reference (format, regex,
        majority, reward): what may decide held-out metrics. ValueError when a list keeps
        none, saying which."""
        from thresher.verifiers import traits

        def kept(names: list[str], where: str) -> list[str]:
            out = [n for n in names if traits(n)["uses_reference"]]
            if not out:
                raise ValueError(
                    f"held-out evaluation would rest only on {', '.join(names)} ({where}), "
                    "which judge without a reference: the round would be measured by the "
                    "signal it trained on. Set eval.verify to a verifier that checks the "
                    "prompt's reference (math, exact, choice, code, judge or reasoning_gym)"
                )
            return out

        verifiers = kept(self.verifiers, "verifiers")
        by_task = {t: kept(names, f"by_task.{t}") for t, names in self.by_task.items()}
        used = set(verifiers) | {n for names in by_task.values() for n in names}
        options = {n: o for n, o in self.options.items() if n in used}
        # no rule carried over: a training rule may negate or excuse a reference check
        return VerifyConfig(verifiers=verifiers, by_task=by_task, options=options)

    def for_task(self, task: str) -> list[str]:
        """The verifiers that score candidates of prompts of `task`."""
        return self.by_task.get(task, self.verifiers)

    def all_names(self) -> list[str]:
        """Every verifier some prompt uses, in a stable order."""
        names = list(self.verifiers)
        for task_names in self.by_task.values():
            names += [n for n in task_names if n not in names]
        return names
