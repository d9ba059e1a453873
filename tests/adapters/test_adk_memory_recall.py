"""End to end: what one process's ADK session taught, another process's agent recalls.

A first process runs an ADK ``Runner`` (scripted model) through a turn in which the user
tells the agent a fact, and adds the session to ``DurableMemoryService``. A second process,
with a new engine, store and Runner, asks a question: its scripted model calls ADK's own
``load_memory`` tool, and answers with what the tool returned. Both processes are children
of the test (nothing is shared but the database), on SQLite, Postgres and MySQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")

from support.sql import STORE_SQL_BACKENDS

pytestmark = pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)

TESTS = Path(__file__).resolve().parents[1]

COMMON = """
import asyncio, sys, warnings
from collections.abc import AsyncIterator
warnings.simplefilter("ignore")  # ADK's experimental-feature notices
from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools import load_memory
from google.genai import types
from sqlalchemy.ext.asyncio import create_async_engine
from durable_sessions import SQLStore
from durable_sessions.adk import DurableMemoryService, DurableSessionService


class Scripted(BaseLlm):
    '''Calls load_memory when the agent has the tool and has not called it yet, then
    answers with the texts of the memories the tool returned (or "Noted.").'''

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncIterator[LlmResponse]:
        results = [
            part.function_response.response
            for content in llm_request.contents for part in content.parts or []
            if part.function_response is not None
        ]
        if "load_memory" in llm_request.tools_dict and not results:
            call = types.FunctionCall(
                id="call-1", name="load_memory", args={"query": "what is my locker code"}
            )
            asking = types.Content(role="model", parts=[types.Part(function_call=call)])
            yield LlmResponse(content=asking)
            return
        recalled = texts(results)
        text = "Recalled: " + " | ".join(recalled) if recalled else "Noted."
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def texts(value):
    # The strings under a "text" key anywhere in a tool's result (dicts, lists, models).
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        found = [value["text"]] if isinstance(value.get("text"), str) else []
        return found + [t for k, v in value.items() if k != "text" for t in texts(v)]
    if isinstance(value, list):
        return [t for item in value for t in texts(item)]
    return []


async def turn(runner, session_id, text):
    message = types.Content(role="user", parts=[types.Part(text=text)])
    said = []
    async for event in runner.run_async(user_id="ada", session_id=session_id, new_message=message):
        if event.content and event.content.parts:
            said += [p.text for p in event.content.parts if p.text]
    return said
"""

TEACH = (
    COMMON
    + """
async def main(url):
    engine = create_async_engine(url)
    store = SQLStore(engine)
    sessions = DurableSessionService(store, org_id="acme")
    memory = DurableMemoryService(store, org_id="acme")
    agent = LlmAgent(name="helper", model=Scripted(model="scripted"), instruction="Help.")
    runner = Runner(agent=agent, app_name="gym", session_service=sessions, memory_service=memory)
    await sessions.create_session(app_name="gym", user_id="ada", session_id="monday")
    print(await turn(runner, "monday", "My locker code is 4812, please remember it."))
    session = await sessions.get_session(app_name="gym", user_id="ada", session_id="monday")
    await memory.add_session_to_memory(session)
    await memory.add_session_to_memory(session)  # again: nothing new
    await engine.dispose()

asyncio.run(main(sys.argv[1]))
"""
)

RECALL = (
    COMMON
    + """
async def main(url):
    engine = create_async_engine(url)
    store = SQLStore(engine)
    sessions = DurableSessionService(store, org_id="acme")
    memory = DurableMemoryService(store, org_id="acme")
    agent = LlmAgent(
        name="helper", model=Scripted(model="scripted"), instruction="Help.", tools=[load_memory]
    )
    runner = Runner(agent=agent, app_name="gym", session_service=sessions, memory_service=memory)
    await sessions.create_session(app_name="gym", user_id="ada", session_id="friday")
    for line in await turn(runner, "friday", "I forgot my locker code. What is it?"):
        print(line)
    await engine.dispose()

asyncio.run(main(sys.argv[1]))
"""
)


def run(script: str, url: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script, url],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{TESTS.parent / 'src'}:{TESTS}"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_a_second_process_recalls_what_the_first_session_taught(
    engine: AsyncEngine, backend_url: str
) -> None:
    # ``engine``: the database is migrated and empty.
    taught = run(TEACH, backend_url)
    assert "Noted." in taught
    recalled = run(RECALL, backend_url).splitlines()
    assert recalled[-1] == "Recalled: My locker code is 4812, please remember it."
