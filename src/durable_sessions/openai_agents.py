"""The OpenAI Agents SDK's ``Session`` over any store, at its public import path.

Requires the ``openai-agents`` extra: ``pip install "durable-sessions[openai-agents]"``.
"""

from __future__ import annotations

from .adapters.openai_agents import DurableSession

__all__ = ["DurableSession"]
