"""docs/guides/web-viewer.md: its Python examples run as written and serve the viewer."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

from sqlalchemy.ext.asyncio import create_async_engine
from starlette.testclient import TestClient

from durable_sessions import SQLStore
from support.viewer import ORG, seed

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "web-viewer.md"


def _examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


def test_the_guide_has_its_examples() -> None:
    assert len(_examples()) == 2
    assert (GUIDE.parent.parent / "images" / "viewer.png").is_file()


@pytest.mark.sqlite
def test_the_starlette_example_serves_the_viewer_under_its_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the example names sessions.db in the working directory

    async def prepare() -> None:
        engine = create_async_engine("sqlite+aiosqlite:///sessions.db")
        try:
            store = SQLStore(engine)
            await store.migrate()
            await seed(store)
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, prepare()).result()
    namespace: dict[str, Any] = {}
    exec(_examples()[0], namespace)
    with TestClient(namespace["app"]) as client:
        assert client.get("/viewer/").status_code == 401
        page = client.get("/viewer/?token=change-me")
        assert page.status_code == 200
        assert str(page.url).endswith(f"/viewer/orgs/{ORG}")
        assert "Trip to Lisbon" in page.text
        assert client.get("/viewer/orgs/other").status_code == 404


def test_the_fastapi_example_mounts_the_viewer() -> None:
    pytest.importorskip("fastapi")
    namespace: dict[str, Any] = {}
    exec(_examples()[1], namespace)
    with TestClient(namespace["api"]) as client:
        home = client.get("/viewer/")
        assert home.status_code == 200
        assert 'name="org"' in home.text
        assert client.post("/viewer/").status_code == 405
