"""The benchmark still runs and prints its one JSON line (not a speed assertion)."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.support.processes import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.postgres
async def test_engine_overhead_prints_one_json_line(pg_url):
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": pg_url.split("?")[0], "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "bench" / "engine_overhead.py"), "--quick", "--replicas", "2",
        env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(300):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    done_stdout = out.decode()
    (line,) = done_stdout.strip().splitlines()
    result = json.loads(line)
    assert result["bench"] == "engine_overhead"
    for key in (
        "ratio_step_to_commit",
        "ratio_step_to_autocommit",
        "autocommit_insert_median_us",
        "step_statements_median_us",
        "ratio_statements_to_autocommit",
        "ratio_tx_throughput_to_raw",
        "load_reduce_10000_us",
    ):
        assert result[key] > 0
    assert result["targets"]["ratio_step_to_autocommit<="] == 2.5
    assert isinstance(result["pass"], bool)
    # Two replicas shared the 50 threads: each ran some, and together all of them.
    assert result["replicas"] == 2
    assert sum(result["replica_threads"]) == 50
    assert all(n > 0 for n in result["replica_threads"])
    assert result["ratio_tx_throughput_to_raw_replicas"] > 0


@pytest.mark.postgres
async def test_latency_prints_one_json_line_with_every_figure(pg_url):
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": pg_url.split("?")[0], "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "bench" / "latency.py"), "--quick", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(420):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-3000:]
    (line,) = out.decode().strip().splitlines()
    result = json.loads(line)
    assert result["bench"] == "latency"
    assert (result["sqlite"]["replicas"], result["postgresql"]["replicas"]) == (1, 2)
    figures = {
        "mention_to_first_post": result["flows"],
        "click_to_card_updated": result["flows"],
        "click_to_tool_started": result["flows"],
        "reply_to_model_request": result["flows"],
        "webhook_to_resume": result["flows"],
        "alert_to_model_request": result["flows"],
        "run_finished_to_model_request_webhook": result["flows"],
        "run_finished_to_model_request_polling": result["flows"],
        "sigkill_to_resume": result["kill_threads"],
        "mention_to_loading_status": result["flows"],
        "first_token_to_first_streamed_character": result["flows"],
    }
    for backend in ("sqlite", "postgresql"):
        counted = {k: result[backend][k]["n"] for k in figures}
        assert counted == figures, backend  # one sample per flow (or held thread), none lost
        assert all(result[backend][k]["p99_ms"] >= result[backend][k]["p50_ms"] for k in figures)
    # The live plan's two lines: the first token stands apart from the rest, so the
    # first streamed character can only have come from it.
    assert result["stream_gap_ms"] >= 100
    assert result["targets"]["mention_to_loading_status_p99_ms<"] == 300
    assert result["targets"]["first_token_to_first_streamed_character_p99_ms<"] == 50
    assert isinstance(result["pass"], bool)
    assert result["pass"] == all(result["checks"].values())


async def test_context_growth_prints_one_json_line():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "bench" / "context_growth.py"), "--quick", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(300):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    (line,) = out.decode().strip().splitlines()
    result = json.loads(line)
    assert result["bench"] == "context_growth"
    assert [row["events"] >= 7 for row in result["sizes"]] == [True, True, True]
    assert all(row["prompt_tokens"] <= result["budget_tokens"] for row in result["sizes"])
