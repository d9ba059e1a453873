"""The scripted demo: a rule-based agent holds a conversation through the public API.

A rule-based agent holds a conversation through the public API as a service would. This
module imports rich (the ``cli`` extra) when it is imported.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from ..context import current_conversation_id
from ..manager import Manager
from ..model import Event, Filter, Session
from ..sql import migrate
from ..sql.store import SQLStore
from .render import DEMO_USER, describe_state, text, when

__all__ = [
    "Concierge",
    "DemoOutput",
    "run_demo",
]

USER = DEMO_USER
APP = "demo"
CITIES = ("Lisbon", "Kyoto", "Oslo")
ALTERNATIVES = {"Lisbon": "Porto", "Kyoto": "Osaka", "Oslo": "Bergen"}
TIPS = {
    "Lisbon": "Ride tram 28 up to Alfama, and have a pastel de nata in Belém.",
    "Porto": "Cross the Dom Luís I bridge at sunset, then taste port in Gaia.",
    "Kyoto": "Walk the Philosopher's Path early, and see Fushimi Inari before the crowds.",
    "Osaka": "Eat your way down Dōtonbori, and take the day trip to Nara's deer park.",
    "Oslo": "Take the ferry to Bygdøy for the Viking ships, then a sauna on the fjord.",
    "Bergen": "Ride the Fløibanen up Mount Fløyen, and walk Bryggen's wooden wharf.",
}


class DemoOutput(Protocol):
    """Where the demo writes: the command line renders it for a terminal or a pipe."""

    def heading(self, text: str) -> None:
        """Start a section."""

    def line(self, text: str = "") -> None:
        """Write a line of narration."""

    def say(self, author: str, text: str) -> None:
        """Write one chat message."""

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """Write a table."""


def tokens(text: str) -> int:
    """Count a message's tokens the way this demo does: one per word (no tokenizer)."""
    return len(text.split())


class Concierge:
    """A travel agent made of keyword rules: no network, no model, the same answer each time."""

    name = "concierge"

    def reply(self, text: str, state: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """Answer a user message; return the reply and the state delta it implies."""
        lowered = text.lower()
        if intro := re.search(r"I'm (\w+).* in (\w+)", text):
            name, city = intro.groups()
            last = state.get("user:last_destination")
            hello = f"Welcome back, {name}! Last time it was {last}." if last else f"Hi {name}!"
            return f"{hello} {city} it is. What budget do you have in mind?", {
                "user:name": name,
                "destination": city,
                "stage": "budget",
            }
        if budget := re.search(r"(\d+) euros", text):
            mode = "train" if "train" in lowered else "plane"
            return f"{budget[1]} EUR by {mode}, noted. I'll remember you prefer the {mode}.", {
                "budget_eur": int(budget[1]),
                "user:travel_mode": mode,
                "stage": "ideas",
            }
        if "miss" in lowered:
            city = state["destination"]
            return TIPS[city], {"stage": "planned", "user:last_destination": city}
        if "book" in lowered:
            bookings = int(state.get("app:bookings", 0)) + 1
            return (
                f"Booked: {state['destination']} by {state.get('user:travel_mode', 'train')}, "
                f"within {state.get('budget_eur')} EUR. That's booking #{bookings} for this app.",
                {"booked": True, "stage": "booked", "app:bookings": bookings},
            )
        if other := re.search(r"what about (\w+)", text):
            city = other[1]
            return f"{city} works too. {TIPS[city]}", {"destination": city, "booked": False}
        return "Tell me where you would like to go.", {}


async def turn(manager: Manager, session: Session, agent: Concierge, text: str) -> str:
    """Handle one user message as a service would: record it, answer, record the answer.

    The session must be bound (``manager.bind``); the bound conversation id tags the turn.
    """
    invocation = f"{current_conversation_id()}/{session.message_count // 2 + 1}"
    await manager.append_event(
        session, Event(author=session.user_id, content=text, invocation_id=invocation,
                       tokens=tokens(text))
    )  # fmt: skip
    answer, delta = agent.reply(text, session.state)
    await manager.append_event(
        session,
        Event(
            author=agent.name,
            content=answer,
            invocation_id=invocation,
            state_delta=delta,
            tokens=tokens(answer),
        ),
    )
    return answer


async def run_demo(
    make_engine: Callable[[], AsyncEngine], out: DemoOutput, *, org_id: str = "default"
) -> str:
    """Run the scripted conversation, restart, resume, fork, and show the results.

    Args:
        make_engine: Makes a new engine on the demo's database; called again to "restart".
        out: Where to write the narration, transcript and tables.
        org_id: The organisation the demo's sessions belong to.

    Returns:
        The id of the conversation the demo held.
    """
    agent = Concierge()
    engine = make_engine()
    try:
        await migrate.upgrade(engine)  # a no-op when the file is already at head
        out.line(f"Schema at revision {await migrate.current(engine)} (head); ready.")
        manager = Manager(SQLStore(engine), app_name=APP)
        session = await manager.create(
            org_id,
            USER,
            state={
                "stage": "new",
                "user:locale": "en-GB",
                "app:agent": "concierge v1",
                "temp:request_id": "req-1",
            },
        )
        run = int(session.get("app:conversations", 0)) + 1
        city = CITIES[(run - 1) % len(CITIES)]
        out.line("A scripted travel agent (a few rules: no model, no network) talks with Ada.")
        out.heading("1. A new conversation")
        out.line(f'Session {session.id} for user "{USER}" in app "{APP}" (org "{org_id}").')
        out.line("Initial state: one key in each scope (private, user:, app:, temp:).")
        script = [
            f"Hi! I'm Ada and I'd like to plan a weekend in {city}.",
            "About 800 euros, and I'd rather take the train.",
            "What should I not miss?",
        ]
        out.line()
        with manager.bind(session):
            for message in script:
                out.say(USER, message)
                out.say(agent.name, await turn(manager, session, agent, message))
        await manager.touch(session, messages=0, first_message=script[0])
        session.set("app:conversations", run)
        await manager.save(session)
        out.line()
        out.line(
            f'Saved: "{session.title}", {session.message_count} messages, '
            f"{session.token_total} tokens."
        )
        session_id = session.id
    finally:
        await engine.dispose()

    out.heading("2. Restart and resume")
    out.line("The engine is gone. A new engine, store and manager resume the session by id.")
    engine = make_engine()
    try:
        manager = Manager(SQLStore(engine), app_name=APP)
        session = await manager.resume(org_id, session_id)
        out.line(f"Bound again: current_conversation_id() is {current_conversation_id()}.")
        out.line("The state survived (temp: keys never leave the process):")
        out.table(["scope", "key", "value"], describe_state(session.state))
        out.line()
        with manager.bind(session):
            message = "Great, please book it."
            out.say(USER, message)
            out.say(agent.name, await turn(manager, session, agent, message))

        out.heading("3. Fork")
        fork = await manager.fork(org_id, session_id, with_events=True)
        alternative = ALTERNATIVES[city]
        out.line(f"Fork {fork.id}: a copy with the transcript, to try another city.")
        out.line()
        with manager.bind(fork):
            message = f"Actually, what about {alternative}?"
            out.say(USER, message)
            out.say(agent.name, await turn(manager, fork, agent, message))
        out.line()
        original = await manager.get(org_id, session_id)
        out.table(
            ["session", "destination", "booked", "forked_from"],
            [
                ["original", text(original.get("destination")), text(original.get("booked")), ""],
                ["fork", text(fork.get("destination")), text(fork.get("booked")), session_id],
            ],
        )

        out.heading("4. Transcript")
        found = await manager.store.list_events(org_id, session_id)
        out.table(
            ["#", "author", "message", "tokens"],
            [[str(e.seq), e.author, text(e.content), str(e.tokens)] for e in found],
        )

        out.heading(f'5. Sessions of app "{APP}"')
        listed = await manager.list(Filter(org_id, app_name=APP))
        out.table(
            ["title", "user", "updated (UTC)", "messages", "tokens"],
            [
                [
                    ("fork: " if s.parent_id else "") + s.title,
                    s.user_id,
                    when(s.updated_at),
                    str(s.message_count),
                    str(s.token_total),
                ]
                for s in listed
            ],
        )
        out.line("Tokens are counted as words here. Run the demo again to add a conversation.")
    finally:
        await engine.dispose()
    return session_id
