"""Keyrings: the master keys that wrap a store's data keys, and what erasure destroys.

A store with a keyring (``SQLStore(engine, keyring=...)``, ``InMemoryStore(keyring=...)``)
encrypts what users said with data keys of its own (AES-256-GCM), one per organisation and
user (and one per organisation and app for ``app:`` state); it stores each data key only
*wrapped* by the keyring. ``Keyring`` is what a store asks of a keyring; ``LocalKeyring``
keeps its keys in a file. See ``docs/guides/encryption.md`` for a keyring over a KMS.

Requires the ``crypto`` extra: ``pip install "durable-sessions[crypto]"``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import json
import os
import secrets
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .errors import DecryptionError, InvalidArgumentError

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        'encryption at rest needs the optional "crypto" extra: '
        'pip install "durable-sessions[crypto]"'
    ) from exc

__all__ = ["Keyring", "LocalKeyring"]


@runtime_checkable
class Keyring(Protocol):
    """What a store asks of a keyring: wrap and unwrap data keys, and forget a scope.

    A *scope* names whose data a data key protects: a string the store makes of the
    organisation and the user (or app), opaque to the keyring. Whatever unwraps a scope's
    keys must live in the keyring (or the KMS behind it), never only in the database:
    ``forget`` destroys it, so that the scope's wrapped keys, in the database or in any copy
    of it, can never be unwrapped again (crypto-shredding), while other scopes' can.
    """

    def current_master(self) -> str:
        """Return the id of the master key that ``wrap`` uses now."""
        ...

    async def wrap(self, scope: str, key: bytes) -> tuple[str, bytes]:
        """Encrypt a data key of ``scope`` under the current master key.

        Returns:
            The id of the master key used, and the wrapped key.
        """
        ...

    async def unwrap(self, scope: str, master_id: str, wrapped: bytes) -> bytes:
        """Decrypt a data key that ``wrap`` returned for ``scope`` under ``master_id``.

        Raises:
            DecryptionError: the master key is not in the keyring, the scope was forgotten,
                or ``wrapped`` is not a key of ``scope`` wrapped by this keyring.
        """
        ...

    async def forget(self, scope: str) -> None:
        """Destroy what unwraps ``scope``'s data keys; forgetting twice is no error."""
        ...


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def _kek(master: bytes, secret: bytes, scope: str) -> AESGCM:
    """The key that wraps a scope's data keys: the master key and the scope's secret mixed."""
    derived = HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=secret,
        info=b"durable-sessions wrap\x00" + scope.encode("utf-8"),
    ).derive(master)
    return AESGCM(derived)


class LocalKeyring:
    """A keyring in a file: master keys, and one secret per scope that ``forget`` deletes.

    The file (JSON) is created on first use with mode 0600 and rewritten whole (to a new
    file, renamed over it) under an exclusive lock, so processes sharing it never lose each
    other's additions. It holds:

    - the master keys (``rotate()`` adds one and makes it current; ``remove(id)`` deletes an
      old one once ``keys rotate`` has re-wrapped every data key under the current one);
    - a 32-byte secret per scope, created when the scope's first data key is wrapped. A data
      key is wrapped (AES-256-GCM) under a key derived (HKDF-SHA256) from a master key *and*
      the scope's secret: ``forget`` deletes the secret, and with it every way to unwrap the
      scope's keys, in the database and in its backups.

    Keep the file out of the database's backups: a backup that holds both tells everything.
    A copy of the file kept elsewhere keeps the forgotten secrets, too.

    ``wrap``, ``unwrap`` and ``forget`` do their file work (waiting for the lock, reading,
    writing and syncing the file) in a worker thread (``asyncio.to_thread``), so that the
    event loop serves other tasks meanwhile; ``rotate`` and ``remove`` run in the caller's
    thread.

    Args:
        path: The keyring file; created (with its first master key) if missing.

    Raises:
        InvalidArgumentError: ``path`` names something other than a regular file, or a file
            that is not a keyring.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        # Through a symlink to the file it names: the rename replaces that file, not the link.
        self.path = Path(os.path.realpath(path))
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {}
        self._raw = b""  # the file's bytes that ``_data`` was parsed from (or written as)
        self._seen: tuple[int, int, int] = (0, 0, 0)
        with self._locked():
            if not self._data.get("masters"):
                self._add_master()

    # -- the file --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the file's lock (a sibling ``.lock`` file) and its current contents."""
        import fcntl

        with self._lock:
            fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._load()
                yield
            finally:
                os.close(fd)  # closing releases the lock

    def _reload(self) -> None:
        """Read the file again, under its lock, if it changed."""
        with self._locked():
            pass

    async def _refresh(self) -> bool:
        """Read the file again (in a worker thread) if it changed since this instance read
        it; return whether it was read."""
        try:
            info = os.stat(self.path)
        except OSError:
            return False
        if (info.st_mtime_ns, info.st_size, info.st_ino) == self._seen:
            return False
        await asyncio.to_thread(self._reload)
        return True

    def _load(self) -> None:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._data = {"format": 1, "current": "", "masters": {}, "scopes": {}}
            self._raw = b""
            return
        if not stat.S_ISREG(info.st_mode):
            raise InvalidArgumentError(f"keyring {str(self.path)!r} is not a regular file")
        raw = self.path.read_bytes()
        if raw != self._raw:  # parsed again only when changed: it grows with the users
            try:
                data = json.loads(raw.decode("utf-8"))
                if not isinstance(data, dict) or data.get("format") != 1:
                    raise ValueError("not a keyring")
                if not isinstance(data.get("masters"), dict) or not isinstance(
                    data.get("scopes"), dict
                ):
                    raise ValueError("not a keyring")
            except ValueError:
                raise InvalidArgumentError(
                    f"{str(self.path)!r} is not a durable-sessions keyring"
                ) from None
            self._data, self._raw = data, raw
        self._seen = (info.st_mtime_ns, info.st_size, info.st_ino)

    def _save(self, **changes: Any) -> None:
        """Write the keyring with ``changes`` (top-level entries) to a new file (mode 0600)
        and rename it over the old one; only then does this instance hold them."""
        data = {**self._data, **changes}
        temp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(6)}.tmp")
        # Compact, through the C encoder: the file grows with one secret per scope.
        raw = json.dumps(data, separators=(",", ":")).encode("utf-8")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(raw)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self.path)
            info = os.stat(self.path)
            self._data, self._raw = data, raw
            self._seen = (info.st_mtime_ns, info.st_size, info.st_ino)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        with contextlib.suppress(OSError):  # make the rename itself durable
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            except OSError as exc:  # pragma: no cover - filesystems without directory sync
                if exc.errno != errno.EINVAL:
                    raise
            finally:
                os.close(dir_fd)

    def _add_master(self) -> str:
        master_id = "m" + secrets.token_hex(6)
        masters = {**self._data["masters"], master_id: _b64(AESGCM.generate_key(bit_length=256))}
        self._save(masters=masters, current=master_id)
        return master_id

    # -- administration --------------------------------------------------------------------

    def rotate(self) -> str:
        """Add a new master key and make it current; return its id.

        Data keys wrapped before stay readable (their master key stays) until re-wrapped:
        run ``durable-sessions keys rotate`` (or ``await store.rotate_keys()``), then
        ``remove`` the old master keys.
        """
        with self._locked():
            return self._add_master()

    def remove(self, master_id: str) -> None:
        """Delete an old master key: every data key wrapped by it becomes unreadable.

        Raises:
            InvalidArgumentError: ``master_id`` is the current master key.
        """
        with self._locked():
            if master_id == self._data["current"]:
                raise InvalidArgumentError(f"master key {master_id!r} is the current one")
            if master_id in self._data["masters"]:
                masters = dict(self._data["masters"])
                del masters[master_id]
                self._save(masters=masters)

    def master_ids(self) -> list[str]:
        """Return the ids of the master keys in the keyring, the current one last."""
        current = self._data["current"]
        return [m for m in self._data["masters"] if m != current] + [current]

    # -- Keyring ---------------------------------------------------------------------------

    def current_master(self) -> str:
        """Return the id of the master key that ``wrap`` uses now."""
        return str(self._data["current"])

    async def wrap(self, scope: str, key: bytes) -> tuple[str, bytes]:
        """Encrypt a data key of ``scope`` under the current master key (see ``Keyring``).

        The file is read again first if another process changed it (a rotation made
        another master key current)."""
        await self._refresh()
        secret = self._data["scopes"].get(scope)
        if secret is None:
            secret = await asyncio.to_thread(self._add_scope, scope)
        master_id = self.current_master()
        nonce = secrets.token_bytes(12)
        kek = _kek(_unb64(self._data["masters"][master_id]), _unb64(secret), scope)
        return master_id, nonce + kek.encrypt(nonce, key, scope.encode("utf-8"))

    async def unwrap(self, scope: str, master_id: str, wrapped: bytes) -> bytes:
        """Decrypt a data key of ``scope`` (see ``Keyring``). The file is read again first
        when it changed, so a scope forgotten (or a master key removed) by another process
        sharing it does not unwrap here either."""
        read = await self._refresh()
        masters, scopes = self._data["masters"], self._data["scopes"]
        if not read and (master_id not in masters or scope not in scopes):
            # Added by another process since this one read the file?
            await asyncio.to_thread(self._reload)
            masters, scopes = self._data["masters"], self._data["scopes"]
        if master_id not in masters:
            raise DecryptionError(f"master key {master_id!r} is not in this keyring")
        if scope not in scopes:
            raise DecryptionError("the data key's scope was erased or is not in this keyring")
        kek = _kek(_unb64(masters[master_id]), _unb64(scopes[scope]), scope)
        try:
            return kek.decrypt(wrapped[:12], wrapped[12:], scope.encode("utf-8"))
        except (InvalidTag, ValueError):
            raise DecryptionError(
                f"a data key does not unwrap under master key {master_id!r}"
            ) from None

    async def forget(self, scope: str) -> None:
        """Delete the scope's secret: its data keys can never be unwrapped again."""
        await asyncio.to_thread(self._forget, scope)

    # -- the file steps of ``wrap`` and ``forget`` (in a worker thread) ---------------------

    def _add_scope(self, scope: str) -> str:
        """The scope's secret, made and written to the file if no process has yet."""
        with self._locked():
            secret = self._data["scopes"].get(scope)
            if secret is None:
                secret = _b64(secrets.token_bytes(32))
                self._save(scopes={**self._data["scopes"], scope: secret})
            return str(secret)

    def _forget(self, scope: str) -> None:
        with self._locked():
            if scope in self._data["scopes"]:
                scopes = dict(self._data["scopes"])
                del scopes[scope]
                self._save(scopes=scopes)
