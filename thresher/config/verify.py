"""The verify section: which verifiers score candidates and which verdicts make them pass."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from thresher.config.base import _Strict
from thresher.rules import rule_names

if TYPE_CHECKING:
    from thresher.config.engine import EngineStage


def _default_verifiers() -> list[str]:
    # local: layering (importing thresher.config loads no stage package)
    from thresher.verifiers import DEFAULT_VERIFIERS

    return list(DEFAULT_VERIFIERS)


def verifiers_in_role(role: str) -> list[str]:
    """The registered verifiers whose held-out role is `role` (e.g. "asked_format": those that
    judge the asked answer format)."""
    # local: layering (importing thresher.config loads no stage package)
    from thresher.verifiers import in_role

    return in_role(role)


class VerifyConfig(_Strict):
    """Which verifiers score the candidates, and which verdicts make a candidate pass."""

    counted_at_default = frozenset({"verifiers", "by_task", "options", "rule"})

    verifiers: list[str] = Field(
        default_factory=_default_verifiers,
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
        # local: layering (importing thresher.config loads no stage package)
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

    @classmethod
    def for_evaluation(cls) -> VerifyConfig:
        """An evaluation's settings when its config names none (EVAL_VERIFIERS)."""
        # local: layering (importing thresher.config loads no stage package)
        from thresher.verifiers import EVAL_VERIFIERS

        return cls(verifiers=list(EVAL_VERIFIERS))

    def in_role(self, role: str) -> list[str]:
        """The verifiers some prompt uses whose held-out role is `role`."""
        # local: layering (importing thresher.config loads no stage package)
        from thresher.verifiers import in_role

        return in_role(role, self.all_names())

    def with_reference(self) -> VerifyConfig:
        """These settings less the verifiers that judge without a reference (format, regex,
        majority, reward): what may decide held-out metrics. ValueError when a list keeps
        none, saying which."""
        # local: layering (importing thresher.config loads no stage package)
        from thresher.verifiers import in_role

        def kept(names: list[str], where: str) -> list[str]:
            out = in_role("reference", names)
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

    def held_out(self) -> VerifyConfig:
        """What decides held-out metrics: with_reference(), and beside those verifiers the
        ones of the asked format among `verifiers` (a format verdict only ever fails a
        candidate the reference check passed; the evaluation reports the lenient reading
        and the format share beside it)."""
        # local: layering (importing thresher.config loads no stage package)
        from thresher.verifiers import in_role

        held_out = self.with_reference()
        formats = in_role("asked_format", self.verifiers)
        if not formats:
            return held_out
        options = {n: self.options[n] for n in formats if self.options.get(n)}
        return held_out.model_copy(
            update={
                "verifiers": [*held_out.verifiers, *formats],
                "options": held_out.options | options,
            }
        )

    def check_pipeline(self, config: EngineStage) -> None:
        """Each verifier's own check of the pipeline config these settings belong to
        (`Verifier.check_config`); options that do not validate are left to the run's plan,
        which names each bad one."""
        from pydantic import ValidationError

        # local: layering (importing thresher.config loads no stage package)
        from thresher.verifiers import verifier_class

        for name in self.all_names():
            cls = verifier_class(name)
            try:
                options = cls.Options.model_validate(self.options.get(name) or {})
            except ValidationError:
                continue
            cls.check_config(options, config)

    def for_task(self, task: str) -> list[str]:
        """The verifiers that score candidates of prompts of `task`."""
        return self.by_task.get(task, self.verifiers)

    def all_names(self) -> list[str]:
        """Every verifier some prompt uses, in a stable order."""
        names = list(self.verifiers)
        for task_names in self.by_task.values():
            names += [n for n in task_names if n not in names]
        return names
