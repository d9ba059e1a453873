"""The ``durable-sessions`` command: demo, migrations, inspection, retention, export, import."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import stat
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from sqlalchemy import URL, make_url
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..errors import (
    InvalidArgumentError,
    SchemaNotMigratedError,
    SessionError,
    StoreUnavailableError,
)
from ..manager import Manager
from ..model import Filter, Session, utcnow
from ..prepare import MAX_TITLE_BYTES, purge_cutoff
from ..sql.store import SQLStore
from ..sql.translate import describe, driver_error, translate_error
from ..sql.urls import async_url, missing_driver, sqlite_file

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["DEFAULT_URL", "URL_ENV", "CLIError", "build_parser", "main", "parse_duration"]

PROG = "durable-sessions"
URL_ENV = "DURABLE_SESSIONS_URL"
"""The environment variable read when ``--url`` is not given."""
DEFAULT_URL = "sqlite+aiosqlite:///durable-sessions.db"
"""The database used when neither ``--url`` nor ``DURABLE_SESSIONS_URL`` is set."""
_YES = "delete without asking (needed when stdin is not a terminal)"
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_LIST_LIMIT = 50
_SHOW_EVENTS = 10


class CLIError(Exception):
    """A mistake the user can fix, reported as one line on stderr with ``code`` as exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- databases -----------------------------------------------------------------------------


def database_url(given: str | None) -> URL:
    """Return the URL to use: ``--url``, else ``$DURABLE_SESSIONS_URL``, else the SQLite file.

    Plain ``postgresql://`` and ``sqlite://`` URLs get their async driver.

    Raises:
        CLIError: The URL cannot be parsed or names an unsupported database or driver.
    """
    raw = given or os.environ.get(URL_ENV) or DEFAULT_URL
    try:
        return async_url(raw)  # its messages never echo the text: it may hold a password
    except InvalidArgumentError as exc:
        raise CLIError(str(exc)) from None


def _make_engine(url: URL) -> AsyncEngine:
    options: dict[str, Any] = {}
    if url.get_backend_name() == "postgresql":
        options["connect_args"] = {"timeout": 10}  # asyncpg waits 60 s by default
    try:
        return create_async_engine(url, **options)
    except ModuleNotFoundError as exc:
        raise CLIError(missing_driver(url)) from exc


@asynccontextmanager
async def _open(args: argparse.Namespace, *, migrated: bool = True) -> AsyncIterator[SQLStore]:
    """Open the store named by the arguments; with ``migrated``, insist on a schema at head."""
    from ..sql import migrate

    url: URL = args.db_url
    path = sqlite_file(url)
    if migrated and path is not None and not path.exists():
        raise SchemaNotMigratedError(
            f"there is no database file {str(path)!r}; create it with "
            f"`{_command(args, 'migrate')}` (or try `{_command(args, 'demo')}`)"
        )
    keyring = _keyring(args)
    engine = _make_engine(url)
    try:
        store = SQLStore(engine, keyring=keyring)
        if migrated:
            revision, head = await migrate.current(engine), migrate.head()
            migrate.check_known(revision)
            if revision != head:
                raise SchemaNotMigratedError(
                    f"the database schema is at {revision or 'no revision'}, this version "
                    f"needs {head}; run `{_command(args, 'migrate')}`"
                )
        yield store
    finally:
        await engine.dispose()


def _keyring(args: argparse.Namespace, *, required: bool = False) -> Any:
    """The keyring of ``--keyring`` (a ``LocalKeyring``, opened once), or None."""
    found = getattr(args, "keyring_obj", None)
    if found is not None:
        return found
    path = getattr(args, "keyring", None)
    if not path:
        if required:
            raise CLIError("this command needs --keyring PATH (the keyring file)", code=2)
        return None
    try:
        from ..crypto import LocalKeyring
    except ImportError as exc:
        raise CLIError(str(exc)) from None
    args.keyring_obj = LocalKeyring(path)
    return args.keyring_obj


def _command(args: argparse.Namespace, *words: str) -> str:
    """The command line to run ``words`` on the same database: with the ``--url`` given
    (its password masked), if one was; a URL from the environment needs none."""
    parts = [PROG]
    if getattr(args, "url", None):
        parts += ["--url", shlex.quote(_given_url(args.url))]
    return " ".join([*parts, *(shlex.quote(word) for word in words)])


def _given_url(text: str) -> str:
    """The URL as the user typed it, with any password masked."""
    url = make_url(text)
    return url.render_as_string(hide_password=True) if url.password else text


async def _confirm(args: argparse.Namespace, question: str, refusal: str) -> None:
    """Go on with --yes; else ask on a terminal; else refuse with one line.

    Raises:
        CLIError: Not confirmed: declined, or no terminal to ask on and no --yes.
    """
    if args.yes:
        return
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        raise CLIError(f"{refusal}; confirm with --yes (there is no terminal to ask on)")
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = await asyncio.to_thread(stdin.readline)
    if answer.strip().lower() not in ("y", "yes"):
        raise CLIError("nothing was deleted")


# -- output --------------------------------------------------------------------------------


def _console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr), or the error naming the extra that brings rich."""
    try:
        from .render import make_console
    except ImportError as exc:
        if not (exc.name or "").startswith("rich"):
            raise
        raise CLIError(
            "tables and progress bars need the optional 'cli' extra: "
            "pip install 'durable-sessions[cli]'"
        ) from None
    return make_console(sys.stderr if stderr else sys.stdout)


def _interactive(data_on_stdout: bool = False) -> bool:
    """Whether to draw progress: stdout and stderr are terminals and stdout carries no data."""
    return not data_on_stdout and sys.stdout.isatty() and sys.stderr.isatty()


@contextmanager
def _progress(label: str, total: int | None, show: bool) -> Iterator[Callable[[int], None]]:
    """Yield an ``advance(n)`` callback that draws a transient bar on stderr when ``show``."""
    if not show:
        yield lambda n: None
        return
    from rich.progress import Progress

    with Progress(console=_console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def parse_duration(text: str) -> timedelta:
    """Parse a duration such as ``90s``, ``15m``, ``12h``, ``30d`` or ``2w``.

    Raises:
        CLIError: The text is not a whole number followed by s, m, h, d or w.
    """
    found = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if found is None:
        raise CLIError(
            f"invalid duration {text!r}: use a whole number followed by s, m, h, d or w "
            "(for example 30d)",
            code=2,
        )
    try:
        return timedelta(**{_UNITS[found[2]]: int(found[1])})
    except OverflowError:
        raise CLIError(f"duration {text!r} is too long", code=2) from None


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}")
    return int(text)


# -- commands ------------------------------------------------------------------------------


async def _demo(args: argparse.Namespace) -> int:
    console = _console()  # the demo draws with rich: without it, one line names the extra
    from .demo import run_demo
    from .render import TerminalOutput

    console.print(f"{PROG} demo: an agent whose conversations outlive the process", style="bold")
    console.print(f"Database: {_safe(args.db_url)}")
    session_id = await run_demo(
        lambda: _make_engine(args.db_url), TerminalOutput(console), org_id=args.org
    )
    org = [] if args.org == "default" else ["--org", args.org]
    console.print(f"Look closer: {_command(args, 'show', session_id, *org)}")
    return 0


async def _migrate(args: argparse.Namespace) -> int:
    from alembic.util import CommandError

    from ..sql import migrate

    down = args.command == "downgrade"

    def progress(line: str) -> None:  # stderr: stdout keeps the one line of the outcome
        print(line, file=sys.stderr, flush=True)

    async with _open(args, migrated=False) as store:
        run = migrate.downgrade if down else migrate.upgrade
        try:
            report = await run(
                store.engine,
                args.revision,
                lock_timeout=getattr(args, "lock_timeout", None),
                progress=progress,
            )
        except CommandError as exc:  # an unknown revision, say
            raise CLIError(f"migration refused: {exc}") from exc
    head = migrate.head()
    if not report.changed:  # at the target already, or another deploy did the work
        where = f"head ({head})" if report.after == head else report.after or "base"
        print(f"Already at {where}; nothing to do.")
    else:
        done = "Downgraded" if down else "Migrated"
        print(f"{done} from {report.before or 'base'} to {report.after or 'base'}.")
    return 0


def _seconds(text: str) -> float:
    """A positive number of seconds (``--lock-timeout``)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


async def _current(args: argparse.Namespace) -> int:
    from ..sql import migrate

    path = sqlite_file(args.db_url)
    revision = None
    if path is None or path.exists():  # asking must not create the file
        async with _open(args, migrated=False) as store:
            revision = await migrate.current(store.engine)
    head = migrate.head()
    migrate.check_known(revision)
    if args.command == "current":
        print(f"{revision or 'none'} ({'head' if revision == head else f'head is {head}'})")
        return 0
    if revision == head:
        print(f"The schema is at head ({head}).")
        return 0
    print(
        f"The schema is at {revision or 'no revision'}, not head ({head}); "
        f"run `{_command(args, 'migrate')}`."
    )
    return 1


async def _list(args: argparse.Namespace) -> int:
    console = _console()
    from .render import draw_table, when

    every = args.all or args.limit == 0
    filter = Filter(args.org, user_id=args.user, app_name=args.app, limit=args.limit)
    columns = ["id", "title", "user", "app", "updated (UTC)", "messages", "tokens"]
    shown = 0
    async with _open(args) as store:
        manager = Manager(store)
        cursor = args.cursor
        while True:  # one page at a time: --all streams them, never holding more than one
            page = await manager.list_page(filter, cursor=cursor)
            rows = [
                [s.id, s.title, s.user_id, s.app_name, when(s.updated_at), *_numbers(s)]
                for s in page.sessions
            ]
            if rows:
                draw_table(console, columns, rows, header=not shown)
                shown += len(rows)
            cursor = page.next_cursor
            if cursor is None or not every:
                break
    if not shown:
        print(f"No sessions in organisation {args.org!r} match.")
    elif cursor is not None:
        narrowing = [
            *(["--org", args.org] if args.org != "default" else []),
            *(["--user", args.user] if args.user is not None else []),
            *(["--app", args.app] if args.app is not None else []),
            *(["--limit", str(args.limit)] if args.limit != _LIST_LIMIT else []),
        ]
        console.print(
            f"The next {args.limit}: `{_command(args, 'list', *narrowing, '--cursor', cursor)}`; "
            "--all (or --limit 0) shows every page."
        )
    return 0


async def _show(args: argparse.Namespace) -> int:
    console = _console()
    from .render import cut, describe_state, draw_table, text, when

    forward = args.after_seq is not None
    async with _open(args) as store:
        s = await store.get(args.org, args.id)
        # Forward, one more than shown tells whether more follow.
        wanted = args.events + 1 if forward else args.events
        found = await store.list_events(args.org, args.id, limit=wanted, after_seq=args.after_seq)
    more = forward and len(found) > args.events
    found = found[: args.events]
    console.print("Session", style="bold")
    facts = {
        "id": s.id, "organisation": s.org_id, "user": s.user_id, "app": s.app_name,
        "title": s.title, "forked from": s.parent_id or "", "created (UTC)": when(s.created_at),
        "updated (UTC)": when(s.updated_at), "messages": s.message_count,
        "tokens": s.token_total, "version": s.version,
    }  # fmt: skip
    for name, value in facts.items():
        console.print(f"  {name:<14}{cut(str(value))}")
    console.print("\nState", style="bold")
    draw_table(console, ["scope", "key", "value (JSON)"], describe_state(s.state))
    if forward:
        heading = f"{len(found)} events after #{args.after_seq} (of {s.message_count})"
    else:
        heading = f"Last {len(found)} of {s.message_count} events"
    console.print(f"\n{heading}", style="bold")
    rows = [
        [
            str(e.seq),
            when(e.timestamp),
            e.author,
            str(e.tokens),
            text(e.content),
            text(e.state_delta or ""),
        ]
        for e in found
    ]
    if rows:
        draw_table(console, ["#", "time (UTC)", "author", "tokens", "content", "state delta"], rows)
    if more:
        org = ["--org", args.org] if args.org != "default" else []
        events = ["--events", str(args.events)] if args.events != _SHOW_EVENTS else []
        after = ["--after-seq", str(found[-1].seq)]
        console.print(
            f"The next events: `{_command(args, 'show', args.id, *org, *events, *after)}`"
        )
    return 0


async def _search(args: argparse.Namespace) -> int:
    console = _console()
    from ..fulltext import snippet
    from .render import draw_table

    words = " ".join(args.words)
    async with _open(args) as store:
        hits = await store.search(
            args.org, words, user_id=args.user, app_name=args.app, limit=args.limit
        )
    if not hits:
        print(f"No events in organisation {args.org!r} hold every word of {words!r}.")
        return 0
    rows = [
        [hit.session_id, str(hit.event.seq), hit.event.author, snippet(hit.event.content, words)]
        for hit in hits
    ]
    draw_table(console, ["session", "#", "author", "text"], rows)
    return 0


async def _fork(args: argparse.Namespace) -> int:
    async with _open(args) as store:
        child = await Manager(store).fork(args.org, args.id, with_events=args.with_events)
    copied = f" with its {child.message_count} events" if args.with_events else ""
    print(f"Forked {args.id} into {child.id}{copied}.")
    return 0


async def _delete(args: argparse.Namespace) -> int:
    async with _open(args) as store:
        await Manager(store).delete(args.org, args.id)
    print(f"Deleted session {args.id} with its state and transcript.")
    return 0


async def _purge(args: argparse.Namespace) -> int:
    older_than = parse_duration(args.older_than)
    try:  # before opening the database: the period itself is wrong
        purge_cutoff(older_than, utcnow())
    except InvalidArgumentError as exc:
        raise CLIError(f"duration {args.older_than!r} is too long: {exc}", code=2) from None
    async with _open(args) as store:
        manager = Manager(store)
        count = await manager.purge(args.org, older_than=older_than, dry_run=True)
        if count and not args.dry_run:
            what = f"{count} sessions of organisation {args.org!r} not updated in {args.older_than}"
            await _confirm(args, f"Delete {what}?", f"purge would delete {what}")
            with _progress(f"Deleting {count} sessions", None, _interactive()):
                count = await manager.purge(args.org, older_than=older_than)
    verb = "Would delete" if args.dry_run else "Deleted"
    print(f"{verb} {count} sessions of organisation {args.org!r} not updated in {args.older_than}.")
    return 0


async def _delete_user(args: argparse.Namespace) -> int:
    async with _open(args) as store:
        manager = Manager(store)
        found = await manager.delete_user(args.org, args.user, dry_run=True)
        state = await store.count_user_state(args.org, args.user)
        memories = await store.count_user_memories(args.org, args.user)
        remembered = f", {memories} memories" if memories else ""
        what = (
            f"{found} sessions (with their transcripts){remembered} and {state} user: state "
            f"rows of user {args.user!r} in {args.org!r}"
        )
        if args.dry_run:
            print(f"Would delete {what}.")
            return 0
        if found or state or memories:
            await _confirm(args, f"Delete {what}?", f"delete-user would delete {what}")
        with _progress(f"Deleting user {args.user!r}", None, _interactive()):
            count = await manager.delete_user(args.org, args.user)
    print(
        f"Deleted {count} sessions{remembered} and the user: state of user {args.user!r} in "
        f"{args.org!r}."
    )
    return 0


async def _keys_rotate(args: argparse.Namespace) -> int:
    keyring = _keyring(args, required=True)
    before = keyring.master_ids()
    current = before[-1] if args.rewrap_only else keyring.rotate()
    async with _open(args) as store:
        count = await store.rotate_keys()
    print(f"Re-wrapped {count} data keys under master key {current}.")
    if args.remove_old:
        old = [m for m in before if m != current]
        for master_id in old:
            keyring.remove(master_id)
        print(f"Removed {len(old)} older master keys from {str(keyring.path)!r}.")
    return 0


async def _keys_reencrypt(args: argparse.Namespace) -> int:
    _keyring(args, required=True)
    async with _open(args) as store:
        with _progress("Re-encrypting", None, _interactive()):
            moved = await store.reencrypt(new_keys=not args.resume, batch=args.batch)
    print(f"Re-encrypted {moved} rows.")
    return 0


def _numbers(session: Session) -> list[str]:
    return [str(session.message_count), str(session.token_total)]


def _summary(counts: Any) -> str:
    return (
        f"{counts.sessions} sessions, {counts.events} events, "
        f"{counts.user_state} user: and {counts.app_state} app: state rows"
        + (f", {counts.memories} memories" if getattr(counts, "memories", 0) else "")
        + (f", {counts.keys} data keys" if getattr(counts, "keys", 0) else "")
    )


async def _export(args: argparse.Namespace) -> int:
    from ..sql.transfer import ExportIncompleteError, count_sessions, export_jsonl

    to_stdout = args.output == "-"
    data_on_stdout = to_stdout or _same_as_stdout(args.output)  # e.g. -o /dev/stdout
    show = _interactive(data_on_stdout=data_on_stdout)
    incomplete: ExportIncompleteError | None = None

    async def export(out: IO[bytes]) -> Any:
        nonlocal incomplete
        try:
            return await export_jsonl(store, out, progress=advance, decrypt=args.decrypt)
        except ExportIncompleteError as exc:  # the rest is written: keep it, then say so
            incomplete = exc
            return exc.counts

    if args.decrypt:
        _keyring(args, required=True)
    async with _open(args) as store:
        total = await count_sessions(store) if show else None
        with _progress("Exporting", total, show) as advance:
            if to_stdout:
                counts = await export(sys.stdout.buffer)
                sys.stdout.buffer.flush()
            else:
                out, partial, target = _open_output(args.output)
                try:
                    with out:
                        counts = await export(out)
                    if partial is not None:
                        partial.replace(target)
                finally:
                    if partial is not None:
                        partial.unlink(missing_ok=True)
    print(f"Exported {_summary(counts)}.", file=sys.stderr if data_on_stdout else sys.stdout)
    if incomplete is not None:
        raise incomplete
    return 0


def _same_as_stdout(given: str) -> bool:
    """Whether ``given`` names what standard output writes to (``/dev/stdout``, say)."""
    try:
        named, stdout = os.stat(given), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError):
        return False
    return (named.st_dev, named.st_ino) == (stdout.st_dev, stdout.st_ino)


def _replaceable(path: Path) -> Path | None:
    """The regular file (or new path) that ``path`` names through its symlinks, which an
    export may replace by writing beside it and renaming; None for anything else (a device,
    a pipe, a socket, an open descriptor such as ``/dev/stdout``), to be written into."""
    for _ in range(40):  # SQLite's and the kernel's limit on symlinks followed
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            return path
        if not stat.S_ISLNK(found.st_mode):
            return path if stat.S_ISREG(found.st_mode) else None
        if path.absolute().parts[1:2] == ("proc",):  # /proc/self/fd/1: an open descriptor
            return None
        path = path.parent / os.readlink(path)
    return None


def _open_output(given: str) -> tuple[BinaryIO, Path | None, Path]:
    """Open where an export goes: ``(stream, partial, target)``.

    A regular file (or a new path), through its symlinks, is written beside itself
    (``partial``, keeping an existing file's permissions) and renamed over ``target`` once
    complete, so a failed export leaves it as it was. Anything else is written into,
    never replaced: ``partial`` is None.

    Raises:
        CLIError: it cannot be opened.
    """
    target = _replaceable(Path(given))
    try:
        if target is None:
            return open(given, "ab"), None, Path(given)
        partial = target.with_name(f".{target.name}.partial")
        out = partial.open("wb")
        with suppress(FileNotFoundError):
            partial.chmod(stat.S_IMODE(target.stat().st_mode))
        return out, partial, target
    except OSError as exc:
        raise CLIError(f"cannot write {given!r}: {exc.strerror}") from None


async def _import(args: argparse.Namespace) -> int:
    from ..sql import migrate
    from ..sql.transfer import import_jsonl

    # Restoring into a new, empty database just works: it is migrated first. A new SQLite
    # file is removed again if the import fails, so a failed restore leaves nothing behind.
    path = sqlite_file(args.db_url)
    created = path is not None and not path.exists()
    try:
        async with _open(args, migrated=False) as store:
            revision, head = await migrate.current(store.engine), migrate.head()
            migrate.check_known(revision)
            if revision is None:
                await migrate.upgrade(store.engine)
                print(f"Migrated the empty database to {head}.")
            elif revision != head:
                raise SchemaNotMigratedError(
                    f"the database schema is at {revision}, this version needs {head}; "
                    f"run `{_command(args, 'migrate')}`"
                )
            # This loop runs only this command, so blocking file reads stall nothing.
            with sys.stdin.buffer if args.input == "-" else open(args.input, "rb") as source:  # noqa: ASYNC230
                size = os.fstat(source.fileno()).st_size if args.input != "-" else None
                show = _interactive() and size is not None
                with _progress("Importing", size, show) as advance:
                    counts = await import_jsonl(store, source, progress=advance)
    except BaseException:
        if created and path is not None:
            for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                leftover.unlink(missing_ok=True)
        raise
    print(f"Imported {_summary(counts)}.")
    if counts.keys_unreadable:
        print(
            f"{counts.keys_unreadable} data keys of the export do not unwrap with this keyring "
            "(users erased since it was written): their rows were imported and cannot be read.",
            file=sys.stderr,
        )
    if counts.titles_cut:
        limit = f"{MAX_TITLE_BYTES:,}"
        print(
            f"Cut {counts.titles_cut} session title{'s' if counts.titles_cut > 1 else ''} "
            f"longer than the {limit}-byte limit.",
            file=sys.stderr,
        )
    return 0


async def _import_adk(args: argparse.Namespace) -> int:
    try:
        from ..adapters.adk.importer import count_adk_sessions, import_adk
    except ImportError as exc:  # the adk extra is missing: the message names it
        raise CLIError(str(exc).split(" (", 1)[0]) from None
    async with _open(args) as store:
        show = _interactive()
        total = await count_adk_sessions(args.source) if show else None
        with _progress("Importing ADK sessions", total, show) as advance:
            counts = await import_adk(args.source, store, org_id=args.org, progress=advance)
    print(f"Imported {_summary(counts)} from the ADK database into organisation {args.org!r}.")
    return 0


async def _serve(args: argparse.Namespace) -> int:
    try:
        from ..web.serve import serve
    except ImportError as exc:  # the web extra is missing: the message names it
        raise CLIError(str(exc).split(" (", 1)[0]) from None
    await serve(args.db_url, host=args.host, port=args.port, org_id=args.org, token=args.token)
    return 0


# -- parser and entry point ----------------------------------------------------------------

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of the ``durable-sessions`` command."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Try, migrate, inspect, search, purge, export and import a durable-sessions database."
        ),
        epilog=f"The database is --url, else ${URL_ENV}, else {DEFAULT_URL}.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--url", help=f"database URL (default: ${URL_ENV} or {DEFAULT_URL})")
    parser.add_argument(
        "--keyring", metavar="PATH", help="the keyring file of an encrypted database"
    )
    # --url also works after the command; SUPPRESS keeps a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help=f"database URL (or ${URL_ENV})")
    common.add_argument(
        "--keyring",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the keyring file of an encrypted database (extra: crypto)",
    )
    org = argparse.ArgumentParser(add_help=False)
    org.add_argument("--org", default="default", help="organisation id (default: %(default)s)")
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    commands.required = True

    def command(name: str, handler: Handler, summary: str, *, with_org: bool = True) -> Any:
        parents = [common, org] if with_org else [common]
        sub = commands.add_parser(name, help=summary, description=summary, parents=parents)
        sub.set_defaults(handler=handler)
        return sub

    command("demo", _demo, "Hold a scripted conversation, restart, resume and fork it.")
    sub = command("migrate", _migrate, "Upgrade the schema to head.", with_org=False)
    sub.add_argument("--revision", default="head", help="target revision (default: head)")
    sub.add_argument(
        "--lock-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="how long a statement waits for a table's lock before it is tried again "
        "(default: 1); nobody waits longer than about this behind the migration",
    )
    command("current", _current, "Print the schema revision of the database.", with_org=False)
    command("check", _current, "Exit 0 only when the schema is at head.", with_org=False)
    sub = command("downgrade", _migrate, "Downgrade the schema to REV.", with_org=False)
    sub.add_argument("revision", metavar="REV", help="a revision, or base (drops every table)")
    sub = command("list", _list, "List sessions, most recently updated first, a page at a time.")
    sub.add_argument("--user", help="only this user's sessions")
    sub.add_argument("--app", help="only this application's sessions")
    sub.add_argument(
        "--limit", type=_count, default=_LIST_LIMIT, help="per page (0: all; default: 50)"
    )
    sub.add_argument("--cursor", help="the page a previous list named as the next")
    sub.add_argument("--all", action="store_true", help="every page, printed as it comes")
    sub = command("show", _show, "Show a session's metadata, state by scope and last events.")
    sub.add_argument("id", help="the session id")
    sub.add_argument("--events", type=_count, default=_SHOW_EVENTS, metavar="N", help="default: 10")
    sub.add_argument(
        "--after-seq", type=_count, metavar="SEQ", help="the events after #SEQ (oldest first)"
    )
    sub = command("search", _search, "Find events holding every word, best match first.")
    sub.add_argument("words", nargs="+", metavar="WORD", help="the words to find")
    sub.add_argument("--user", help="only this user's sessions")
    sub.add_argument("--app", help="only this application's sessions")
    sub.add_argument("--limit", type=_count, default=20, help="at most N (default: 20)")
    sub = command("fork", _fork, "Start a new session from a copy of one's private state.")
    sub.add_argument("id", help="the session id")
    sub.add_argument("--with-events", action="store_true", help="copy the transcript too")
    sub = command("delete", _delete, "Delete a session with its state and transcript.")
    sub.add_argument("id", help="the session id")
    sub = command("purge", _purge, "Delete the sessions not updated for a while.")
    sub.add_argument("--older-than", required=True, metavar="AGE", help="90s, 15m, 12h, 30d, 2w")
    sub.add_argument("--dry-run", action="store_true", help="count only, delete nothing")
    sub.add_argument("-y", "--yes", action="store_true", help=_YES)
    sub = command("delete-user", _delete_user, "Erase a user's sessions and user: state.")
    sub.add_argument("user", metavar="USER", help="the user id")
    sub.add_argument("--dry-run", action="store_true", help="count only, delete nothing")
    sub.add_argument("-y", "--yes", action="store_true", help=_YES)
    sub = command("export", _export, "Write all organisations as JSON Lines.", with_org=False)
    sub.add_argument("-o", "--output", default="-", metavar="FILE", help="default: - (stdout)")
    sub.add_argument(
        "--decrypt",
        action="store_true",
        help="write an encrypted database's values in plaintext, without its keys "
        "(needs --keyring); by default they stay sealed, with their wrapped keys",
    )
    sub = command("import", _import, "Load an export, all or nothing.", with_org=False)
    sub.add_argument("-i", "--input", default="-", metavar="FILE", help="default: - (stdin)")
    sub = command("import-adk", _import_adk, "Copy an ADK DatabaseSessionService database.")
    sub.add_argument("--from", dest="source", required=True, metavar="URL", help="its db_url")
    sub = command(
        "serve",
        _serve,
        "Browse sessions, transcripts and state in a read-only web viewer.",
        with_org=False,
    )
    sub.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    sub.add_argument("--port", type=int, default=8765, help="port (default: %(default)s)")
    sub.add_argument("--org", help="show this organisation only (default: any, by id)")
    sub.add_argument("--token", help="require this token (Bearer header, or ?token= once)")
    sub = command("keys", _keys_rotate, "Rotate or re-encrypt the keys of an encrypted database.",
                  with_org=False)  # fmt: skip
    actions = sub.add_subparsers(title="actions", dest="keys_action", metavar="ACTION")
    actions.required = True
    rotate = actions.add_parser(
        "rotate",
        parents=[common],
        help="add a master key and re-wrap every data key under it",
        description="Add a new master key to the keyring and re-wrap every data key under "
        "it (no data is rewritten).",
    )
    rotate.set_defaults(handler=_keys_rotate)
    rotate.add_argument(
        "--rewrap-only", action="store_true", help="re-wrap under the current master key"
    )
    rotate.add_argument(
        "--remove-old",
        action="store_true",
        help="then remove the older master keys (no other process may still use them)",
    )
    reencrypt = actions.add_parser(
        "reencrypt",
        parents=[common],
        help="move every row to new data keys, and encrypt plaintext rows",
        description="Give every user and app a new data key and move every row to it; "
        "encrypt rows written before the database had a keyring. Online, in batches.",
    )
    reencrypt.set_defaults(handler=_keys_reencrypt)
    reencrypt.add_argument(
        "--resume", action="store_true", help="no new data keys: finish a run that stopped"
    )
    reencrypt.add_argument("--batch", type=_count, default=500, help="rows per batch")
    return parser


def _safe(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _root_cause(exc: BaseException) -> str:
    """The driver's own error behind ``exc``, as the error map describes it."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return describe(driver_error(exc))


def _message(exc: BaseException, url: URL | None, args: argparse.Namespace | None = None) -> str:
    """The one line that explains an error, with any password of the URL masked."""
    if isinstance(exc, (StoreUnavailableError, sa_exc.DBAPIError)):
        where = _safe(url) if url is not None else "the database"
        text = f"cannot use the database at {where} ({_root_cause(exc)})"
    elif isinstance(exc, SchemaNotMigratedError) and args is not None:
        # The library's own hint names no URL: point it at this database.
        text = str(exc).replace(f"`{PROG} migrate`", f"`{_command(args, 'migrate')}`")
    elif isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc)
    if url is not None and url.password:
        text = text.replace(str(url.password), "***")
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 0
    url: URL | None = None
    try:
        args.db_url = url = database_url(args.url)
        handler: Handler = args.handler
        return asyncio.run(handler(args))
    except CLIError as exc:
        print(f"{PROG}: error: {_message(exc, url, args)}", file=sys.stderr)
        return exc.code
    except sa_exc.DBAPIError as exc:  # raised outside a store operation: map it as one would
        error = translate_error(PROG, exc)
        error.__cause__ = exc
        print(f"{PROG}: error: {_message(error, url, args)}", file=sys.stderr)
        return 1
    except (SessionError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):  # the reader went away (e.g. `| head`)
            with suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        print(f"{PROG}: error: {_message(exc, url, args)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
