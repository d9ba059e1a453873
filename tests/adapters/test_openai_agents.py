"""The OpenAI Agents SDK adapter: the SDK's Session protocol on memory, SQLite and Postgres."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, RunConfig, Runner, function_tool
from agents.items import ModelResponse, TResponseInputItem
from agents.memory import Session as SdkSession
from agents.memory import SessionSettings
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary
from sqlalchemy.ext.asyncio import create_async_engine

from durable_sessions import (
    Event,
    Filter,
    InMemoryStore,
    InvalidArgumentError,
    InvalidStateError,
    Manager,
    MissingScopeError,
    Session,
    SessionExistsError,
    SessionNotFoundError,
    SQLStore,
    Store,
)
from durable_sessions.openai_agents import DurableSession
from support.sql import STORE_SQL_BACKENDS

APP = "openai-agents"


def canonical(items: list[Any]) -> str:
    """JSON text that tells 1, 1.0 and True apart and ignores object key order."""
    return json.dumps(items, sort_keys=True, ensure_ascii=False)


def user(text: str) -> TResponseInputItem:
    return {"role": "user", "content": text}


def reply(text: str) -> TResponseInputItem:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


# -- the protocol -------------------------------------------------------------------------------


async def test_the_session_protocol(store: Store) -> None:
    session = DurableSession("conv-1", store, org_id="acme", user_id="alice")
    assert isinstance(session, SdkSession)
    assert await session.get_items() == []
    assert await session.pop_item() is None
    await session.clear_session()
    assert await session.info() is None  # reads and no-op writes create nothing

    await session.add_items([user("Where is my order?"), reply("On its way.")])
    await session.add_items([user("When?"), reply("Tomorrow.")])
    await session.add_items([])
    items = await session.get_items()
    assert [i.get("role") for i in items] == ["user", "assistant", "user", "assistant"]
    assert await session.get_items(limit=2) == items[2:]
    assert await session.get_items(limit=0) == []
    assert await session.get_items(limit=10) == items
    with pytest.raises(InvalidArgumentError):
        await session.get_items(limit=-1)

    assert await session.pop_item() == items[3]
    assert await session.get_items() == items[:3]
    await session.add_items([reply("Tomorrow, before noon.")])
    assert (await session.get_items())[-1] == reply("Tomorrow, before noon.")

    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    kept = await session.info()
    assert kept is not None
    assert (kept.title, kept.message_count) == ("Where is my order?", 0)
    await session.add_items([user("Again")])
    assert await session.get_items() == [user("Again")]


async def test_session_settings_limit_is_the_default_of_get_items(store: Store) -> None:
    session = DurableSession("conv", store, session_settings=SessionSettings(limit=2))
    await session.add_items([user(str(n)) for n in range(5)])
    assert await session.get_items() == [user("3"), user("4")]
    assert len(await session.get_items(limit=4)) == 4


async def test_a_bad_item_is_refused_and_nothing_of_its_batch_is_stored(store: Store) -> None:
    session = DurableSession("conv", store)
    await session.add_items([user("first")])
    with pytest.raises(InvalidStateError):
        await session.add_items([user("fine"), user("nul \x00 inside")])
    with pytest.raises(TypeError):
        await session.add_items(["not a dict"])  # type: ignore[list-item]
    assert await session.get_items() == [user("first")]
    with pytest.raises(InvalidArgumentError):
        DurableSession("", store)


async def test_an_item_the_store_cannot_take_is_invalid_state_whatever_field_holds_it(
    store: Store,
) -> None:
    # A NUL or a lone surrogate in the role or type is refused as the item's content is:
    # InvalidStateError, not an error about an "author" the caller never gave.
    session = DurableSession("conv", store)
    await session.add_items([user("first")])
    for bad in (
        {"role": "us\x00er", "content": "x"},
        {"type": "mess\x00age", "content": "x"},
        {"role": "\ud800", "content": "x"},
        {"type": "function_call", "role": "a" * 300 + "\x00"},
    ):
        with pytest.raises(InvalidStateError):
            await session.add_items([user("fine"), bad])  # type: ignore[list-item]
    # A role too long to be an author is stored, the item's type its author.
    long_role = {"type": "message", "role": "r" * 300, "content": "kept"}
    await session.add_items([long_role])  # type: ignore[list-item]
    # Usage past what one event counts is stored, its tokens counted up to that limit.
    huge = {**reply("big usage"), "usage": {"total_tokens": 2**40}}
    await session.add_items([huge])
    assert await session.get_items() == [user("first"), long_role, huge]
    info = await session.info()
    assert info is not None
    assert (info.message_count, info.token_total) == (3, 2**31 - 1)


async def test_another_writers_events_read_as_messages_of_their_authors_role(
    store: Store,
) -> None:
    # get_items, pop_item and rewind turn an event that is not an item into the same
    # message: the user's words stay the user's.
    session = DurableSession("conv", store)
    await session.add_items([user("from the SDK")])
    await store.append_event("default", "conv", Event("user", content="What is 2+2?"))
    await store.append_event("default", "conv", Event("model", content={"n": [4]}))
    await store.append_event("default", "conv", Event("agent", content=["four", 4]))
    expected = [
        user("from the SDK"),
        {"role": "user", "content": "What is 2+2?"},
        {"n": [4]},  # a dict is taken as an item, whoever wrote it
        {"role": "assistant", "content": '["four", 4]'},
    ]
    assert await session.get_items() == expected
    assert await session.get_items(limit=2) == expected[2:]
    assert await session.pop_item() == expected[3]
    assert await session.rewind(1) == expected[1:3]


# -- every item shape, exactly ------------------------------------------------------------------

ITEM_SHAPES: list[Any] = [
    {"role": "user", "content": 'plain text: ünïcødé, emoji 🚀, quotes " and \\ backslash'},
    {"type": "message", "role": "system", "content": "Be brief."},
    {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is in this image and file?"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0K", "detail": "low"},
            {"type": "input_file", "file_id": "file-123", "filename": "a.pdf"},
        ],
    },
    {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [
            {
                "type": "output_text",
                "text": "See [1].",
                "annotations": [
                    {"type": "url_citation", "start_index": 4, "end_index": 7, "url": "https://x"}
                ],
                "logprobs": [{"token": "See", "logprob": -0.25, "bytes": [83, 101, 101]}],
            },
            {"type": "refusal", "refusal": "no"},
        ],
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "lookup",
        "arguments": '{"city": "Lisbon", "days": 3}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 21.5}'},
    {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": [{"type": "input_text", "text": "ok"}],
    },
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Thinking."}],
        "content": [{"type": "reasoning_text", "text": "step 1"}],
        "encrypted_content": "gAAAAABencrypted==",
    },
    {
        "type": "file_search_call",
        "id": "fs_1",
        "queries": ["refund policy"],
        "status": "completed",
        "results": [{"file_id": "f", "score": 0.5, "text": "30 days", "attributes": {"n": 1}}],
    },
    {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "weather"},
    },
    {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "c1",
        "action": {"type": "click", "button": "left", "x": 10, "y": 20},
        "pending_safety_checks": [],
        "status": "completed",
    },
    {
        "type": "computer_call_output",
        "call_id": "c1",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AAAA"},
    },
    {
        "type": "image_generation_call",
        "id": "ig_1",
        "result": "iVBORw0KGgo=",
        "status": "completed",
    },
    {
        "type": "code_interpreter_call",
        "id": "ci_1",
        "code": "print(1)",
        "container_id": "cntr",
        "outputs": [{"type": "logs", "logs": "1\n"}],
        "status": "completed",
    },
    {
        "type": "local_shell_call",
        "id": "ls_1",
        "call_id": "l1",
        "action": {"type": "exec", "command": ["ls", "-la"], "env": {}},
        "status": "completed",
    },
    {"type": "local_shell_call_output", "id": "l1", "output": "total 0"},
    {
        "type": "mcp_list_tools",
        "id": "ml_1",
        "server_label": "srv",
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
    },
    {
        "type": "mcp_approval_request",
        "id": "ma_1",
        "server_label": "srv",
        "name": "t",
        "arguments": "{}",
    },
    {"type": "mcp_approval_response", "approval_request_id": "ma_1", "approve": True},
    {"type": "mcp_call", "id": "mc_1", "server_label": "srv", "name": "t", "arguments": "{}"},
    {"type": "custom_tool_call", "call_id": "ct", "name": "grammar", "input": "x = 1"},
    {"type": "custom_tool_call_output", "call_id": "ct", "output": "done"},
    {"type": "item_reference", "id": "msg_abc"},
    {"type": "compaction", "encrypted_content": "opaque"},
    # JSON that must come back with its types: floats stay floats, big ints stay exact.
    {
        "type": "function_call_output",
        "call_id": "n",
        "output": "x",
        "extra": {"f": 1.0, "e": 1e16, "neg": -0.5, "big": 2**62, "t": True, "none": None},
    },
]


def sdk_produced_items() -> list[TResponseInputItem]:
    """Items as the SDK itself produces them from a model's output."""
    response = ModelResponse(
        output=[
            ResponseReasoningItem(
                id="rs_2", type="reasoning", summary=[Summary(text="Plan.", type="summary_text")]
            ),
            ResponseFunctionToolCall(
                id="fc_2",
                call_id="call_9",
                name="lookup",
                arguments='{"q": "x"}',
                type="function_call",
                status="completed",
            ),
            ResponseOutputMessage(
                id="msg_2",
                role="assistant",
                status="completed",
                type="message",
                content=[ResponseOutputText(text="Done.", annotations=[], type="output_text")],
            ),
        ],
        usage=Usage(),
        response_id="resp_1",
    )
    return response.to_input_items()


async def test_every_item_shape_round_trips_exactly(store: Store) -> None:
    items = [*ITEM_SHAPES, *sdk_produced_items()]
    session = DurableSession("shapes", store)
    await session.add_items(items)
    back = await session.get_items()
    assert back == items
    assert canonical(back) == canonical(items)
    assert type(back[-4]["extra"]["f"]) is float  # the numbers item, before the SDK's three
    # A fresh object on the same store reads the same items.
    again = await DurableSession("shapes", store).get_items()
    assert canonical(again) == canonical(items)
    for n in range(len(items), 0, -1):
        assert canonical([await session.pop_item()]) == canonical([items[n - 1]])


# -- the durable session behind it --------------------------------------------------------------


async def test_the_first_write_creates_a_titled_session_with_counters(store: Store) -> None:
    session = DurableSession("conv", store, org_id="acme", user_id="alice")
    await session.add_items(
        [
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "My   order 1234 is late, where is it?"}
                ],
            },
            {**reply("Checking."), "usage": {"total_tokens": 42}},
        ]
    )
    info = await session.info()
    assert info is not None
    assert (info.title, info.user_id, info.app_name) == (
        "My order 1234 is late, where is it?",
        "alice",
        APP,
    )
    assert (info.message_count, info.token_total) == (3, 42)

    untitled = DurableSession("quiet", store, org_id="acme", user_id="alice")
    await untitled.add_items([reply("Hello first")])
    assert (await untitled.info()).title == ""  # type: ignore[union-attr]
    # Another object (another request, another process) titles it from its user message.
    later = DurableSession("quiet", store, org_id="acme", user_id="alice")
    await later.add_items([user("Then a question")])
    await untitled.add_items([user("And another one")])
    assert (await untitled.info()).title == "Then a question"  # type: ignore[union-attr]
    # A session made through the core API, untitled, too.
    await Manager(store, app_name=APP).create("acme", "alice", id="made")
    await DurableSession("made", store, org_id="acme", user_id="alice").add_items(
        [{"role": "system", "content": "Be brief."}, user("Made elsewhere")]
    )

    usage = Usage(requests=1, input_tokens=70, output_tokens=30, total_tokens=100)
    await session.store_run_usage(usage)
    assert (await session.info()).token_total == 142  # type: ignore[union-attr]

    listed = await Manager(store).list(Filter("acme", user_id="alice", app_name=APP))
    assert {(s.id, s.title, s.message_count) for s in listed} == {
        ("conv", "My order 1234 is late, where is it?", 3),
        ("quiet", "Then a question", 3),
        ("made", "Made elsewhere", 2),
    }


async def test_fork_branches_the_conversation(store: Store) -> None:
    parent = DurableSession("trunk", store, org_id="acme", user_id="alice")
    with pytest.raises(Exception, match="not found"):
        await parent.fork()  # nothing written yet
    await parent.add_items([user("Plan a trip"), reply("Where to?")])
    branch = await parent.fork("branch")
    assert isinstance(branch, DurableSession)
    assert branch.session_id == "branch"
    assert await branch.get_items() == await parent.get_items()
    await branch.add_items([user("Lisbon")])
    await parent.add_items([user("Tokyo")])
    assert (await branch.get_items())[-1] == user("Lisbon")
    assert (await parent.get_items())[-1] == user("Tokyo")
    info = await branch.info()
    assert info is not None
    assert (info.parent_id, info.user_id, info.message_count) == ("trunk", "alice", 3)
    anonymous = await parent.fork()
    assert anonymous.session_id not in ("trunk", "branch")
    assert len(await anonymous.get_items()) == 3
    children = await Manager(store).list(Filter("acme", parent_id="trunk"))
    assert {c.id for c in children} == {"branch", anonymous.session_id}


async def test_rewind_keeps_the_first_items(store: Store) -> None:
    session = DurableSession("conv", store)
    items = [user("a"), reply("b"), user("c"), reply("d")]
    await session.add_items(items)
    assert await session.rewind(4) == []
    assert await session.rewind(1) == items[1:]
    assert await session.get_items() == items[:1]
    await session.add_items([user("c2")])
    assert await session.get_items() == [user("a"), user("c2")]
    info = await session.info()
    assert info is not None
    assert info.message_count == 2
    with pytest.raises(InvalidArgumentError):
        await session.rewind(-1)
    assert await DurableSession("never-written", store).rewind(0) == []


async def test_tenants_are_isolated(store: Store) -> None:
    a = DurableSession("same-id", store, org_id="org-a")
    b = DurableSession("same-id", store, org_id="org-b")
    await a.add_items([user("from a")])
    await b.add_items([user("from b"), user("b again")])
    assert await a.get_items() == [user("from a")]
    assert await b.pop_item() == user("b again")
    await b.clear_session()
    assert await a.get_items() == [user("from a")]
    assert await b.get_items() == []


async def test_another_user_or_app_naming_the_same_id_never_reaches_it(store: Store) -> None:
    """Session ids are unique per organisation: mallory (or another app of alice's) naming
    alice's id reads nothing, adds nothing, pops, rewinds, clears and forks nothing."""
    alice = DurableSession("conv", store, org_id="acme", user_id="alice")
    await alice.add_items([user("my secret"), reply("kept")])
    await alice.store_run_usage(Usage(total_tokens=7))
    others = [
        DurableSession("conv", store, org_id="acme", user_id="mallory"),
        DurableSession("conv", store, org_id="acme", user_id="alice", app_name="other-app"),
    ]
    for other in others:
        assert await other.get_items() == []
        assert await other.get_items(limit=1) == []
        assert await other.info() is None
        with pytest.raises(SessionExistsError, match="another app or user"):
            await other.add_items([user("let me in")])
        assert await other.pop_item() is None
        assert await other.rewind(0) == []
        await other.clear_session()
        await other.store_run_usage(Usage(total_tokens=1000))
        with pytest.raises(SessionNotFoundError):
            await other.fork()
    assert await alice.get_items() == [user("my secret"), reply("kept")]
    stored = await store.get("acme", "conv")
    assert (stored.user_id, stored.message_count, stored.token_total) == ("alice", 2, 7)
    assert [s.id for s in await store.list(Filter("acme"))] == ["conv"]  # no fork was made


async def test_a_checked_session_deleted_and_taken_by_another_user_is_not_written(
    store: Store,
) -> None:
    """alice's object checked the id once; mallory deletes it and creates their own under
    it: alice's writes go into nothing of mallory's (each carries the life it checked)."""
    alice = DurableSession("conv", store, org_id="acme", user_id="alice")
    mallory = DurableSession("conv", store, org_id="acme", user_id="mallory")
    await alice.add_items([user("alice 1")])
    await store.delete("acme", "conv")
    await mallory.add_items([user("mallory 1"), user("mallory 2")])
    with pytest.raises(SessionExistsError):
        await alice.add_items([user("alice 2")])
    assert await alice.pop_item() is None
    await alice.clear_session()
    assert await alice.rewind(0) == []
    assert await alice.get_items() == []
    assert await mallory.get_items() == [user("mallory 1"), user("mallory 2")]
    # And back: alice's again, once mallory's is gone.
    await store.delete("acme", "conv")
    await alice.add_items([user("alice 3")])
    assert await alice.get_items() == [user("alice 3")]
    assert (await store.get("acme", "conv")).user_id == "alice"


async def test_without_org_id_each_call_uses_the_bound_organisation(store: Store) -> None:
    session = DurableSession("conv", store, org_id=None)
    with pytest.raises(MissingScopeError):
        await session.get_items()
    manager = Manager(store)
    for org in ("org-a", "org-b"):
        bound = await manager.create(org, "u")
        with manager.bind(bound):
            await session.add_items([user(org)])
    with manager.bind(Session(id="x", org_id="org-a", user_id="u")):
        assert await session.get_items() == [user("org-a")]
        assert await DurableSession("conv", store, org_id="org-b").get_items() == [user("org-b")]


# -- concurrency --------------------------------------------------------------------------------


async def test_concurrent_batches_never_interleave_or_lose_an_item(store: Store) -> None:
    session = DurableSession("busy", store)
    tasks, rounds, size = 6, 8, 3

    async def writer(task: int) -> None:
        mine = DurableSession("busy", store)  # each task its own object, as each request would
        for r in range(rounds):
            await mine.add_items([user(f"{task}/{r}/{i}") for i in range(size)])

    await asyncio.gather(*(writer(t) for t in range(tasks)))
    texts = [item["content"] for item in await session.get_items()]  # type: ignore[typeddict-item]
    assert len(texts) == tasks * rounds * size
    assert sorted(texts) == sorted(
        f"{t}/{r}/{i}" for t in range(tasks) for r in range(rounds) for i in range(size)
    )
    for start in range(0, len(texts), size):
        batch = texts[start : start + size]
        prefix = batch[0].rsplit("/", 1)[0]
        assert batch == [f"{prefix}/{i}" for i in range(size)]


async def test_concurrent_pops_and_adds_lose_and_duplicate_nothing(store: Store) -> None:
    session = DurableSession("stack", store)
    await session.add_items([user(f"seed-{n}") for n in range(20)])
    popped: list[Any] = []

    async def popper() -> None:
        for _ in range(8):
            item = await DurableSession("stack", store).pop_item()
            if item is not None:
                popped.append(item["content"])  # type: ignore[typeddict-item]

    async def adder(task: int) -> None:
        for n in range(5):
            await DurableSession("stack", store).add_items([user(f"add-{task}-{n}")])

    await asyncio.gather(*(popper() for _ in range(3)), *(adder(t) for t in range(3)))
    left = [item["content"] for item in await session.get_items()]  # type: ignore[typeddict-item]
    added = [f"seed-{n}" for n in range(20)] + [f"add-{t}-{n}" for t in range(3) for n in range(5)]
    assert len(popped) >= 20  # a pop finds nothing only once every seed is gone
    assert sorted(popped + left) == sorted(added)
    info = await session.info()
    assert info is not None
    assert info.message_count == len(left)


def _add_batches(url: str, worker: int, rounds: int, size: int) -> int:
    """In a spawned process: add ``rounds`` batches of ``size`` items to one session."""

    async def run() -> int:
        engine = create_async_engine(url)
        try:
            session = DurableSession("shared", SQLStore(engine))
            for r in range(rounds):
                await session.add_items([user(f"{worker}/{r}/{i}") for i in range(size)])
        finally:
            await engine.dispose()
        return rounds * size

    return asyncio.run(run())


@pytest.mark.slow
@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_batches_from_processes_never_interleave(
    backend: str, backend_url: str, engine: Any
) -> None:
    workers, rounds, size = 3, 15, 4
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        loop = asyncio.get_running_loop()
        done = await asyncio.gather(
            *(
                loop.run_in_executor(pool, _add_batches, backend_url, w, rounds, size)
                for w in range(workers)
            )
        )
    assert sum(done) == workers * rounds * size
    texts = [i["content"] for i in await DurableSession("shared", SQLStore(engine)).get_items()]  # type: ignore[typeddict-item]
    assert sorted(texts) == sorted(
        f"{w}/{r}/{i}" for w in range(workers) for r in range(rounds) for i in range(size)
    )
    for start in range(0, len(texts), size):
        prefix = texts[start].rsplit("/", 1)[0]
        assert texts[start : start + size] == [f"{prefix}/{i}" for i in range(size)]


# -- a real Runner, across restarts -------------------------------------------------------------


class ScriptedModel(Model):
    """A model that answers from a script (no network) and keeps what it was sent."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script = list(script)
        self.inputs: list[list[TResponseInputItem]] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.inputs.append(list(input) if isinstance(input, list) else [user(input)])
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        return ModelResponse(output=self.script.pop(0), usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


@function_tool
def order_status(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id} ships tomorrow"


def answer(text: str, n: int) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=f"msg_{n}",
        role="assistant",
        status="completed",
        type="message",
        content=[ResponseOutputText(text=text, annotations=[], type="output_text")],
    )


async def run_turn(url: str, model: ScriptedModel, text: str) -> str:
    """One 'process': a new engine, store and session; one Runner.run; then shut down."""
    engine = create_async_engine(url)
    try:
        session = DurableSession("support-42", SQLStore(engine), org_id="acme", user_id="alice")
        agent = Agent(name="support", instructions="Help.", model=model, tools=[order_status])
        result = await Runner.run(
            agent, text, session=session, run_config=RunConfig(tracing_disabled=True)
        )
        await session.store_run_usage(result)
        return str(result.final_output)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("backend", STORE_SQL_BACKENDS)
async def test_a_runner_keeps_its_history_across_restarts(
    backend: str, backend_url: str, engine: Any
) -> None:
    call = ResponseFunctionToolCall(
        id="fc_1",
        call_id="call_1",
        name="order_status",
        arguments='{"order_id": "1234"}',
        type="function_call",
        status="completed",
    )
    first = ScriptedModel([[call], [answer("It ships tomorrow.", 1)]])
    assert await run_turn(backend_url, first, "Where is order 1234?") == "It ships tomorrow."

    second = ScriptedModel([[answer("You asked about order 1234.", 2)]])
    out = await run_turn(backend_url, second, "What did I ask?")
    assert out == "You asked about order 1234."
    seen = second.inputs[0]
    kinds = [i.get("type", "message") for i in seen]
    assert kinds == ["message", "function_call", "function_call_output", "message", "message"]
    assert seen[0] == {"content": "Where is order 1234?", "role": "user"}
    assert "ships tomorrow" in json.dumps(seen[2])
    assert seen[-1] == {"content": "What did I ask?", "role": "user"}

    store = SQLStore(engine)
    history = await DurableSession("support-42", store, org_id="acme", user_id="alice").get_items()
    assert len(history) == 6
    info = await store.get("acme", "support-42")
    assert (info.title, info.message_count, info.user_id) == ("Where is order 1234?", 6, "alice")
    assert info.token_total == 3 * 15  # three model calls, recorded by store_run_usage
    events = await store.list_events("acme", "support-42")
    assert [e.seq for e in events] == list(range(1, 7))
    assert isinstance(events[0], Event)


def test_the_memory_store_works_without_a_database() -> None:
    async def main() -> list[Any]:
        session = DurableSession("m", InMemoryStore())
        await session.add_items([user("hi")])
        return await session.get_items()

    assert asyncio.run(main()) == [user("hi")]
