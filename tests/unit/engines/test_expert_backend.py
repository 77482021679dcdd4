"""The expert backend: each episode's requests answered with that episode's own plan, 404 for an episode without one,
``/v1/models`` for a request naming none; run in this test's event loop through ``httpx.ASGITransport``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import yaml

from orchard.engines.expert import ExpertBackend
from orchard.engines.scripted import ScriptedPlan, ScriptedStep

BODY = {"model": "m", "messages": [{"role": "user", "content": "go"}]}


def plan(*texts: str) -> ScriptedPlan:
    return ScriptedPlan(steps=[ScriptedStep(text=text) for text in texts], final_text="done", model="m")


async def replies(backend: ExpertBackend, episode_id: str, n: int) -> list[str]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=backend), base_url="http://expert") as client:
        answers, headers = [], {"X-Orchard-Episode-Id": episode_id}
        for _ in range(n):
            response = await client.post("/v1/chat/completions", json=BODY, headers=headers)
            response.raise_for_status()
            answers.append(response.json()["choices"][0]["message"]["content"])
        return answers


def test_each_episode_replays_its_own_plan_from_its_first_step() -> None:
    backend = ExpertBackend(model="m", policy_version=2)
    backend.register("a", plan("a1", "a2"))
    backend.register("b", plan("b1"))
    assert len(backend) == 2
    assert asyncio.run(replies(backend, "a", 1)) == ["a1"]
    assert asyncio.run(replies(backend, "b", 2)) == ["b1", "done"]
    assert asyncio.run(replies(backend, "a", 2)) == ["a2", "done"]


def test_an_episode_without_a_plan_is_refused_naming_it_and_models_answer_anyone() -> None:
    async def ask() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=ExpertBackend(model="listed"))
        async with httpx.AsyncClient(transport=transport, base_url="http://expert") as client:
            missing = await client.post("/v1/chat/completions", json=BODY, headers={"X-Orchard-Episode-Id": "nope"})
            return missing, await client.get("/v1/models")

    missing, models = asyncio.run(ask())
    assert missing.status_code == 404 and "'nope'" in missing.json()["error"]["message"]
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["listed"]


def test_from_directory_registers_every_plan_by_its_file_name(tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "demo-t-0.yaml").write_text(yaml.safe_dump(plan("hello").model_dump(mode="json")))
    backend = ExpertBackend.from_directory(tmp_path)
    assert len(backend) == 1
    assert asyncio.run(replies(backend, "demo-t-0", 1)) == ["hello"]


def test_a_negative_latency_is_refused() -> None:
    with pytest.raises(ValueError, match="latency_s"):
        ExpertBackend(latency_s=-1)
