"""An agent: a model, the renderers that build its input, its tools and its limits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..errors import ConfigurationError
from ..ids import check_id
from ..models.base import ModelSpec
from .context import Renderer
from .tools import Tool

__all__ = ["Agent"]


@dataclass(eq=False)
class Agent:
    name: str
    model: ModelSpec
    context: list[Renderer]
    tools: list[Tool] = field(default_factory=list)
    max_steps: int = 10
    """Model calls one invocation may make (across resumes) before it ends with ``max_steps``."""
    output: type[BaseModel] | None = None
    """A model the final answer must match; the run's ``output.value`` is then an instance of it."""

    @classmethod
    def build(
        cls,
        *,
        name: str,
        model: ModelSpec | Mapping[str, Any],
        context: Sequence[Renderer] | None,
        tools: Sequence[Tool] | None,
        max_steps: int,
        output: type[BaseModel] | None,
    ) -> Agent:
        check_id(name, "agent name")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ConfigurationError(f"agent {name!r}: max_steps is an int >= 1, not {max_steps!r}")
        renderers = list(context or ())
        for renderer in renderers:
            if not callable(getattr(renderer, "render", None)):
                raise ConfigurationError(f"agent {name!r}: {renderer!r} is not a context renderer (app.context.*)")
        tool_list = list(tools or ())
        names: set[str] = set()
        for tool in tool_list:
            if not isinstance(tool, Tool):
                raise ConfigurationError(f"agent {name!r}: {tool!r} is not a tool (build tools with app.tool)")
            if tool.name in names:
                raise ConfigurationError(f"agent {name!r} lists tool {tool.name!r} twice")
            names.add(tool.name)
        if output is not None and not (isinstance(output, type) and issubclass(output, BaseModel)):
            raise ConfigurationError(f"agent {name!r}: output must be a pydantic model class, not {output!r}")
        return cls(name, ModelSpec.of(model), renderers, tool_list, max_steps, output)

    def tool(self, name: str) -> Tool | None:
        for tool in self.tools:
            if tool.name == name:
                return tool
        return None
