"""Who may answer a yielded call: the rules a tool declares with ``answerable_by``, and their one check.

A yielding tool names who may answer its calls (``app.tool(..., yield_schema=Approval, answerable_by=...)``):

* ``"tenant"`` (the default): anyone who reaches the session, that is anyone in its tenant;
* ``"group:NAME"``: members of group ``NAME`` (on AWS the ``cognito:groups`` claim, e.g. ``group:approvers``);
* ``"starter"``: the principal who started the invocation that made the call;
* ``"not_starter"``: anyone but that principal (four eyes).

A tuple of rules asks for all of them: ``("group:approvers", "not_starter")`` is an approver who is not the
requester. The rules are checked where every answer enters a ledger: ``LedgerRules`` (``dormant.ledger``),
which ``session.append`` runs on each event, and so ``session.input.answer(..., principal=, groups=)``,
``POST /tools``, the inspector's form (it asks the API), a run's input, a remote runner's commit (with a
``Caller``: the answer is that caller's) and ``app.sessions.from_events``. The starter is read from the
invocation the waiting call was yielded in, on the ledger, never from the answer. A refused answer is
``AnswerRefused`` (403), naming the call and the rule, and nothing is written. Only ``"tenant"`` admits an
answer with no principal (an in-process answer by the app's own code): every other rule needs to know who
answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .errors import AnswerRefused, ConfigurationError

__all__ = ["ANYONE", "Caller", "answering_groups", "check_answer", "may_answer", "parse_groups", "parse_rules"]

ANYONE = "tenant"
_RULE = re.compile(r"tenant|starter|not_starter|group:[^\s,]{1,128}")


@dataclass(frozen=True)
class Caller:
    """Who is acting: the principal (on AWS the token's ``sub``) and the groups it belongs to."""

    principal: str
    groups: frozenset[str] = field(default_factory=frozenset)


def parse_rules(answerable_by: str | Sequence[str]) -> tuple[str, ...]:
    """``answerable_by`` as a tuple of rules (all must hold), or a ``ConfigurationError`` naming the bad one."""
    rules = (answerable_by,) if isinstance(answerable_by, str) else tuple(answerable_by)
    if not rules:
        raise ConfigurationError("answerable_by names at least one rule (the default is 'tenant')")
    for rule in rules:
        if not isinstance(rule, str) or not _RULE.fullmatch(rule):
            raise ConfigurationError(
                f"answerable_by is 'tenant', 'group:NAME', 'starter' or 'not_starter' (or a tuple of them), "
                f"not {rule!r}"
            )
    return rules


def parse_groups(value: object) -> frozenset[str]:
    """Groups as a claim carries them: a list, or one string (``"a,b"`` from a REST API's authorizer,
    ``"[a b]"`` from a JWT authorizer), or nothing."""
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset(part for part in re.split(r"[,\s]+", value.strip().strip("[]")) if part)
    if isinstance(value, Iterable):
        return frozenset(str(part).strip() for part in value if str(part).strip())
    return frozenset()


def answering_groups(rules: Sequence[str], groups: Iterable[str]) -> list[str] | None:
    """The groups an answer is recorded with: those of the answerer's ``groups`` that ``rules`` name (``None``:
    none). The ledger then says why a ``group:`` rule admitted the answer, and the check at append reads it."""
    named = sorted({rule.removeprefix("group:") for rule in rules if rule.startswith("group:")} & set(groups))
    return named or None


def refusal(rules: Sequence[str], principal: str | None, groups: frozenset[str], starter: str | None) -> str | None:
    """Why the caller may not answer under ``rules`` (``None``: it may); the first rule that refuses it."""
    for rule in rules:
        if rule == ANYONE:
            continue
        if principal is None:
            return f"{rule}: the answer names no principal (who answers must be known)"
        if rule.startswith("group:"):
            if rule.removeprefix("group:") not in groups:
                return f"{rule}: {principal!r} is not a member"
        elif starter is None:
            return f"{rule}: who started the invocation is not recorded"
        elif rule == "starter" and principal != starter:
            return f"{rule}: {principal!r} did not start the invocation"
        elif rule == "not_starter" and principal == starter:
            return f"{rule}: {principal!r} started the invocation and may not answer it too (four eyes)"
    return None


def may_answer(rules: Sequence[str], principal: str | None, groups: frozenset[str], starter: str | None) -> bool:
    return refusal(rules, principal, groups, starter) is None


def check_answer(
    rules: Sequence[str],
    *,
    call_id: str,
    tool: str,
    principal: str | None,
    groups: frozenset[str],
    starter: str | None,
    field: str | None = None,
) -> None:
    """Raise ``AnswerRefused`` (403) when ``rules`` refuse this answer."""
    why = refusal(rules, principal, groups, starter)
    if why is not None:
        rule, _, reason = why.partition(": ")
        raise AnswerRefused(call_id, tool, rule, reason, field=field)
