"""Translations from agent frameworks to the ``Store``: Google ADK and the OpenAI Agents SDK.

Each needs its framework installed (the ``adk`` and ``openai-agents`` extras); nothing here
is imported by the core.
"""

__all__: list[str] = []
