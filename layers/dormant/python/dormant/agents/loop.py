"""The run loop: render, call the model, run the tools it asks for, until it answers — or yields.

Every step lands on the ledger as it happens: ``invocation_start`` (or ``invocation_resume``),
``model_start``, ``model_end``, ``assistant``, ``tool_call``, state changes, ``tool_result``,
``invocation_yield`` or ``invocation_end``. Nothing a model, tool or renderer does crashes the caller:
a bad tool call becomes a ``tool_result`` error the model sees next step; a failing model or renderer
ends the run with status ``error``. Only bad *input* from the caller raises, before anything is written.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from .. import metrics
from ..errors import AgentMismatch, AwaitingInput, ConfigurationError, InputError, ModelError
from ..events import (
    AssistantEvent,
    Event,
    InvocationEndEvent,
    InvocationResumeEvent,
    InvocationStartEvent,
    InvocationYieldEvent,
    ModelEndEvent,
    ModelStartEvent,
    PendingCall,
    ToolCallEvent,
    ToolInputEvent,
    Usage,
    UserEvent,
)
from ..ids import new_id
from ..models.base import Message, ModelAdapter, ModelRequest, ModelResponse, ModelSpec
from ..projection import Output
from ..session import Runtime, Session
from ..state.access import Invocation
from ..state.values import repaired, unstorable
from ..transcript import by_reference, digest
from .agent import Agent
from .calls import callable_with, describe, json_args, ms_since, storable_response, unyielded
from .context import RenderContext
from .execute import execute
from .run import Checkpoint, RunInput, RunResult, RunStatus, RunStream
from .tools import json_schema

if TYPE_CHECKING:
    pass

__all__ = ["Checkpoint", "RunInput", "RunResult", "RunStatus", "RunStream", "start_run"]


def start_run(
    runtime: Runtime,
    agent: Agent,
    input: Any,
    session: Session | None,
    *,
    adapter_for: Callable[[ModelSpec], ModelAdapter],
    ephemeral: Callable[[], Session],
    invocation_id: str | None = None,
    deadline: int | None = None,
    checkpoint: Checkpoint | None = None,
    principal: str | None = None,
    groups: Iterable[str] = (),
) -> RunStream:
    """Check the input (raising, with nothing written, if it is bad) and return the run's event stream.

    ``adapter_for`` resolves an agent's model to its adapter; ``ephemeral`` builds the session a run
    without one uses. The app passes both, so the loop never reaches back into it. A runner (a server
    running turns) passes ``invocation_id`` for a new invocation (so it can name the turn before claiming
    it), its ``deadline`` (recorded on the ledger) and a ``checkpoint``. ``principal`` (a member of ``groups``)
    is who runs it: recorded on the invocation's start and on the answers the input gives, which each tool's
    ``answerable_by`` must admit.
    """
    if not isinstance(agent, Agent):
        raise ConfigurationError(f"app.run takes an agent built with app.agent, not {agent!r}")
    if session is None:
        session = ephemeral()
    elif not isinstance(session, Session):
        raise InputError(f"session is a Session (from app.sessions), not {type(session).__name__}", field="session")
    elif session.runtime is not runtime:
        raise InputError("that session belongs to another app", field="session")
    run_input = RunInput.parse(input)
    stored: dict[str, dict[str, Any]] = {}
    seeds = session.access.seeds(run_input.initial_state, stored)
    state: dict[str, Any] = {}
    if run_input.state:
        base = {**session.projection.session_state, **seeds.get("session", {})}
        state = session.access.check("session", run_input.state, base=base)
    answers = session.input.prepare(run_input.answers, principal=principal, groups=groups, field=run_input.named)
    projection = session.projection
    if run_input.message is not None:
        # A call left waiting would get its result after the message, a transcript no provider accepts:
        # every yielded call is answered first (now, or before). So is a yielding call whose yield was never
        # recorded (its runner died between the two): it waits all the same, and the loop would hear the
        # message before writing the yield. A takeover without a message records it.
        answering = {answer.call_id for answer in answers}
        unanswered = [call_id for call_id in projection.pending if call_id not in answering]
        unanswered += [call.call_id for call in unyielded(agent, projection) if call.call_id not in answering]
        if unanswered:
            raise AwaitingInput(session.id, unanswered)
    if projection.open_invocation is not None:
        waiting = projection.invocations[projection.open_invocation].agent_name
        if waiting != agent.name:
            raise AgentMismatch(waiting, agent.name)
    run = _Run(adapter_for, agent, session, run_input, seeds, state, stored, answers)
    run.invocation_id, run.deadline, run.checkpoint = invocation_id, deadline, checkpoint
    run.principal = principal
    return RunStream(run.steps())


class _Run:
    def __init__(
        self,
        adapter_for: Callable[[ModelSpec], ModelAdapter],
        agent: Agent,
        session: Session,
        run_input: RunInput,
        seeds: dict[str, dict[str, Any]],
        state: dict[str, Any],
        stored: dict[str, dict[str, Any]],
        answers: list[ToolInputEvent],
    ) -> None:
        self.adapter_for = adapter_for
        self.agent = agent
        self.session = session
        self.input = run_input
        self.seeds = seeds
        self.state = state
        """``input["state"]`` as checked by ``start_run``: the session values it leaves."""
        self.stored = stored
        """Shared scopes as stored, loaded once for the whole run."""
        self.answers = answers
        self.message = run_input.message
        """The user's message, appended once the calls it follows have their results."""
        self.start = self.mark = len(session.events)
        self.usage = Usage()
        self.invocation_id: str | None = None
        self.deadline: int | None = None
        self.checkpoint: Checkpoint | None = None
        self.principal: str | None = None

    def _go_on(self) -> bool:
        """Whether the runner lets the run take its next step (it commits what the run holds first)."""
        return self.checkpoint is None or self.checkpoint()

    def _hear(self, invocation: Invocation) -> None:
        """Append the user's message (once)."""
        assert self.message is not None
        self.session.append(UserEvent(text=self.message, invocation_id=invocation.id, agent_name=invocation.agent_name))
        self.message = None

    def _new(self) -> list[Event]:
        events = self.session.events[self.mark :]
        self.mark += len(events)
        return events

    def steps(self) -> Generator[Event, None, RunResult]:
        session, projection = self.session, self.session.projection
        direct = session.access
        for scope, values in self.seeds.items():
            if values:
                direct.write(scope, values)
        if self.input.state:
            direct.record("session", self.input.state, self.state)
        for answer in self.answers:
            session.append(answer)
        yield from self._new()

        if projection.pending and not projection.unexecuted_calls():
            # Still waiting on every yielded call: nothing can run (a message was refused by start_run).
            return self._result("yielded_tool", projection.open_invocation)

        agent_name = self.agent.name
        if projection.open_invocation is not None:
            invocation_id = projection.open_invocation
            session.append(
                InvocationResumeEvent(invocation_id=invocation_id, agent_name=agent_name, deadline=self.deadline)
            )
        else:
            invocation_id = self.invocation_id or new_id("inv_")
            session.append(
                InvocationStartEvent(
                    invocation_id=invocation_id, agent_name=agent_name, deadline=self.deadline, principal=self.principal
                )
            )
        invocation = session.invocation(invocation_id, agent_name, stored=self.stored)
        if self.message is not None and not projection.unexecuted_calls():
            self._hear(invocation)  # with the invocation's start: a claim of the turn holds its message
        yield from self._new()
        try:
            status = yield from self._loop(invocation)
        except Exception as exc:  # a bug below us must still end the invocation on the ledger
            self._end(invocation, "error", error=exc)
            yield from self._new()
            status = "error"
        return self._result(status, invocation_id)

    def _loop(self, invocation: Invocation) -> Generator[Event, None, RunStatus]:
        projection = self.session.projection
        steps_used = projection.invocations[invocation.id].model_calls
        while True:
            waiting = False
            for call in projection.unexecuted_calls():
                tool = self.agent.tool(call.name)
                if (
                    tool is not None
                    and tool.yields
                    and call.call_id not in projection.answered
                    and callable_with(tool, call)  # bad arguments fail now, not after a human answered
                ):
                    waiting = True
                    continue
                if not self._go_on():
                    return "handed_on"
                answer = projection.answered.get(call.call_id)
                self.session.append(execute(self.agent, self.session, invocation, tool, call, answer))
                yield from self._new()
            if self.message is not None:  # after the results of the calls it follows, before the model's turn
                self._hear(invocation)
                yield from self._new()
            if waiting or projection.pending:
                pending = [
                    PendingCall(call_id=c.call_id, name=c.name, args=c.args) for c in projection.open_calls.values()
                ]
                self.session.append(
                    InvocationYieldEvent(invocation_id=invocation.id, agent_name=invocation.agent_name, pending=pending)
                )
                yield from self._new()
                return "yielded_tool"
            if steps_used >= self.agent.max_steps:
                self._end(invocation, "max_steps")
                yield from self._new()
                return "max_steps"
            if not self._go_on():
                return "handed_on"
            steps_used += 1
            response = yield from self._call_model(invocation)
            if response is None:
                return "error"
            if not response.tool_calls:
                status = self._answer(invocation, response)
                yield from self._new()
                return status
            if response.text:
                self._say(invocation, response.text, None)
            taken = set(projection.open_calls)
            for requested in response.tool_calls:
                call_id = requested.call_id if requested.call_id and requested.call_id not in taken else new_id("call_")
                taken.add(call_id)
                args, error = json_args(requested.args)
                self.session.append(
                    ToolCallEvent(
                        call_id=call_id,
                        name=requested.name,
                        args=args,
                        error=requested.error if requested.error is not None else error,
                        invocation_id=invocation.id,
                        agent_name=invocation.agent_name,
                    )
                )
            yield from self._new()

    def _previous_call(self, invocation_id: str) -> ModelStartEvent | None:
        """The invocation's last ``model_start`` among the events the session holds (not fetched: none when a
        snapshot's tail starts after it), looked for back to the invocation's start."""
        for event in reversed(self.session.held_from(None)[1]):
            if isinstance(event, ModelStartEvent) and event.invocation_id == invocation_id:
                return event
            if isinstance(event, InvocationStartEvent) and event.invocation_id == invocation_id:
                return None
        return None

    def _call_model(self, invocation: Invocation) -> Generator[Event, None, ModelResponse | None]:
        agent, session = self.agent, self.session
        spec = agent.model
        try:
            adapter = self.adapter_for(spec)
            context = RenderContext(invocation.state, session, agent.name, invocation.id)
            parts = [renderer.render(context) for renderer in agent.context]
        except Exception as exc:
            self._end(invocation, "error", error=exc)
            yield from self._new()
            return None
        messages: list[Message] = [m for part in parts for m in part.messages]
        tools = [tool.definition() for tool in agent.tools]
        records, tools_as_in = [part.record for part in parts], None
        previous = self._previous_call(invocation.id)
        if previous is not None:  # the prompt and tools again: held by reference, not stored on every call
            records, tools_as_in = by_reference(records, tools, previous, session.held_event)
        session.append(
            ModelStartEvent(
                invocation_id=invocation.id,
                agent_name=agent.name,
                model=spec.ref,
                input=records,
                message_count=len(messages),
                digest=digest(messages),
                tools=[] if tools_as_in else tools,
                tools_as_in=tools_as_in,
            )
        )
        yield from self._new()
        request = ModelRequest(
            model=spec,
            messages=messages,
            tools=tools,
            output_schema=json_schema(agent.output) if agent.output else None,
            output_name=agent.output.__name__ if agent.output else None,
        )
        started = time.perf_counter()
        try:
            response = adapter.complete(request)
            if not isinstance(response, ModelResponse):
                response = ModelResponse.model_validate(response)
            response = storable_response(response)
        except Exception as exc:
            session.append(
                ModelEndEvent(
                    invocation_id=invocation.id,
                    agent_name=agent.name,
                    model=spec.ref,
                    error=describe(exc),
                    error_type=type(exc).__name__,
                    latency_ms=ms_since(started),
                )
            )
            self._end(invocation, "error", error=exc)
            yield from self._new()
            return None
        self.usage += response.usage
        session.append(
            ModelEndEvent(
                invocation_id=invocation.id,
                agent_name=agent.name,
                model=spec.ref,
                usage=response.usage,
                finish_reason=response.finish_reason,
                latency_ms=ms_since(started),
            )
        )
        usage = response.usage
        metrics.model_call(agent.name, usage.input_tokens, usage.output_tokens, (time.perf_counter() - started) * 1000)
        yield from self._new()
        return response

    def _answer(self, invocation: Invocation, response: ModelResponse) -> RunStatus:
        """The model answered without tool calls: record the answer (checked against ``output``) and end."""
        text, value = response.text, None
        output_model = self.agent.output
        if output_model is not None:
            try:
                value = repaired(output_model.model_validate_json(text or "").model_dump(mode="json"))
                problem = unstorable(value)
                if problem is not None:
                    raise ModelError(f"the model's answer holds {problem[1]} at {problem[0] or 'the top'}")
            except (ValidationError, ModelError) as exc:
                why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
                self._say(invocation, text, None)
                self._end(
                    invocation,
                    "error",
                    error=ModelError(f"the model's answer does not match {output_model.__name__}: {why}"),
                )
                return "error"
        self._say(invocation, text, value)
        self._end(invocation, "completed", text=text, value=value)
        return "completed"

    def _say(self, invocation: Invocation, text: str | None, value: Any) -> None:
        if text is None and value is None:
            return
        self.session.append(
            AssistantEvent(text=text, value=value, invocation_id=invocation.id, agent_name=invocation.agent_name)
        )

    def _end(
        self,
        invocation: Invocation,
        status: Literal["completed", "error", "max_steps"],
        *,
        text: str | None = None,
        value: Any = None,
        error: BaseException | None = None,
    ) -> None:
        self.session.append(
            InvocationEndEvent(
                invocation_id=invocation.id,
                agent_name=invocation.agent_name,
                status=status,
                output_text=text,
                output_value=value,
                error=describe(error) if error is not None else None,
                error_type=type(error).__name__ if error is not None else None,
            )
        )

    def _result(self, status: RunStatus, invocation_id: str | None) -> RunResult:
        session = self.session
        events = session.events[self.start :]
        end = next((e for e in reversed(events) if isinstance(e, InvocationEndEvent)), None)
        output = session.output
        if self.agent.output is not None and output.value is not None:
            with contextlib.suppress(ValidationError):  # recorded under another output model: keep the JSON
                output = Output(output.text, self.agent.output.model_validate(output.value))
        return RunResult(
            status=status,
            session=session,
            output=output,
            yielded_tools=session.yielded_tools,
            usage=self.usage,
            error=end.error if end is not None else None,
            error_type=end.error_type if end is not None else None,
            invocation_id=invocation_id,
            events=events,
        )
