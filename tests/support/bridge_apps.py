"""What ``DORMANT_APP`` names to serve the LangGraph threads and Agents SDK sessions of the bridge tests."""

from __future__ import annotations

from dormant.bridges.inspection import inspected

LANGGRAPH = inspected("langgraph", "LangGraph")
AGENTS = inspected("openai-agents", "OpenAI Agents SDK")
