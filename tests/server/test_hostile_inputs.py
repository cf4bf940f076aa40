"""The /nbscale/api/ endpoints under what a broken pool, a damaged store or a probing client sends them: every
answer is strict JSON, unknown ids are 404s with a message, and one bad source never blanks the whole panel."""

from __future__ import annotations

import json
import math
import os
import time

import pytest
from tornado.httpclient import HTTPClientError

from nbscale.pool import registry
from nbscale.server.handlers import json_text


def _strict(body: bytes) -> dict:
    """Parse as a browser's JSON.parse would: Infinity, -Infinity and NaN are errors there."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(body, parse_constant=refuse)


async def _get(jp_fetch, *path: str) -> dict:
    response = await jp_fetch("nbscale", "api", *path)
    assert response.code == 200
    return _strict(response.body)


async def test_a_pool_file_with_infinite_or_nan_numbers_is_answered_as_strict_json(jp_fetch, pool_dir) -> None:
    worker = {"rank": 0, "state": "idle", "memory_mb": math.nan}
    state = {"kernel_id": "abc", "size": 1, "idle_timeout": math.inf, "idle_for": -math.inf, "workers": [worker]}
    with pytest.raises(ValueError):  # a pool of this version never writes such numbers
        registry.publish(state)
    # a file written otherwise (an earlier nbscale, another tool) is passed over: the answer stays strict JSON
    pool_dir.mkdir(parents=True, exist_ok=True)
    own = pool_dir / f"{os.getpid()}.json"
    own.write_text(json.dumps({**state, "pid": os.getpid(), "heartbeat": time.time()}))
    assert "Infinity" in own.read_text()
    try:
        assert (await _get(jp_fetch, "pools"))["pools"] == []
    finally:
        registry.withdraw()
    assert json.loads(json_text({"idle_timeout": math.inf, "memory_mb": math.nan})) == {
        "idle_timeout": None,
        "memory_mb": None,
    }


@pytest.mark.parametrize("content", ['["a", "list"]', '{"pid": "me", "heartbeat": "now"}', '"text"'])
async def test_a_registry_file_no_pool_wrote_leaves_the_panel_working(jp_fetch, pool_dir, content) -> None:
    pool_dir.mkdir(parents=True, exist_ok=True)
    (pool_dir / "1.json").write_text(content)
    answer = await _get(jp_fetch, "pools")
    assert answer["pools"] == []
    assert "error" not in answer or answer["error"].startswith("The pool registry cannot be read")
    assert (await _get(jp_fetch, "jobs"))["available"] in (True, False)  # the panel's other parts answer


@pytest.mark.parametrize("job_id", ["0", "99999999999999999999", "9" * 30, "9" * 5000, "18446744073709551616"])
async def test_a_job_id_past_any_job_is_a_404_with_a_json_message(jp_fetch, tmp_path, monkeypatch, job_id) -> None:
    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path))
    for method, action in (("GET", "log"), ("POST", "cancel")):
        with pytest.raises(HTTPClientError) as missing:
            await jp_fetch(
                "nbscale", "api", "jobs", job_id, action, method=method, body=b"{}" if method == "POST" else None
            )
        assert missing.value.code == 404
        message = _strict(missing.value.response.body)["message"]
        assert message.startswith("There is no job ") and message.endswith(" the numbers %jobs shows.")
        assert len(message) < 300


async def test_a_damaged_job_store_is_named_while_pools_and_gpus_still_answer(
    jp_fetch, tmp_path, monkeypatch, pool_dir
) -> None:
    import nbscale.jobs as jobs

    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path))
    store = jobs.JobStore()
    store.create("one", None, str(tmp_path))
    store.index_path.write_bytes(b"")
    answer = await _get(jp_fetch, "jobs")
    assert answer["jobs"] == [] and f"The job store index {store.index_path} is damaged" in answer["error"]
    assert (await _get(jp_fetch, "pools"))["pools"] == []
    assert "gpus" in await _get(jp_fetch, "gpus")
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("nbscale", "api", "jobs", "1", "log")
    assert refused.value.code == 404 and "is damaged" in _strict(refused.value.response.body)["message"]


async def test_a_job_id_with_leading_zeros_is_that_job(jp_fetch, tmp_path, monkeypatch) -> None:
    import nbscale.jobs as jobs

    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path))
    store = jobs.JobStore()
    job_id = store.create("one", None, str(tmp_path))
    store.log_path(job_id).write_text("hello\n")
    assert await _get(jp_fetch, "jobs", f"000{job_id}", "log") == {"id": job_id, "log": "hello\n", "truncated": False}


def test_json_text_is_strict_json_whatever_it_is_given() -> None:
    value = {"a": [math.inf, -math.inf, math.nan, 1.5, (2, math.nan)], "b": {"c": math.nan}, "d": object}
    assert _strict(json_text(value).encode()) == {
        "a": [None, None, None, 1.5, [2, None]],
        "b": {"c": None},
        "d": str(object),
    }


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "jobs/-1/log"),
        ("GET", "jobs/abc/log"),
        ("GET", "jobs/1/log/extra"),
        ("GET", "jobs/%2e%2e/log"),
        ("POST", "jobs/1/delete"),
        ("GET", "nothing"),
    ],
)
async def test_a_path_no_endpoint_serves_is_a_json_404_naming_the_endpoints(jp_fetch, method, path) -> None:
    with pytest.raises(HTTPClientError) as missing:
        await jp_fetch("nbscale", "api", *path.split("/"), method=method, body=b"{}" if method == "POST" else None)
    assert missing.value.code == 404
    assert (
        "serves gpus, pools, jobs, jobs/<id>/log and jobs/<id>/cancel"
        in _strict(missing.value.response.body)["message"]
    )


async def test_an_unknown_path_still_needs_the_token(jp_fetch) -> None:
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("nbscale", "api", "nothing", headers={"Authorization": ""})
    assert refused.value.code == 403


async def test_a_huge_log_is_read_from_its_end_and_bad_utf8_is_replaced(jp_fetch, tmp_path, monkeypatch) -> None:
    import nbscale.jobs as jobs
    from nbscale.server.handlers import LOG_TAIL_CHARS

    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path))
    store = jobs.JobStore()
    job_id = store.create("chatty", None, str(tmp_path))
    with open(store.log_path(job_id), "wb") as log:  # 64 MiB of output, as a runaway print loop leaves it
        log.write(b"start\n")
        log.truncate(64 * 2**20)
        log.seek(0, 2)
        log.write(b"\xff\xfe not utf-8 \xe9\nthe end\n")
    answer = await _get(jp_fetch, "jobs", str(job_id), "log")
    assert answer["truncated"] and len(answer["log"]) == LOG_TAIL_CHARS
    assert answer["log"].endswith("\ufffd\ufffd not utf-8 \ufffd\nthe end\n")
    assert jobs.get(job_id).log(tail=8) == "the end\n" and jobs.get(job_id).log(tail=0) == ""


async def test_a_registry_folder_others_can_write_is_answered_with_why_not_read(jp_fetch, pool_dir) -> None:
    # another user could put a FIFO there (which would hang the server's reader) or a fake pool
    pool_dir.mkdir(parents=True)
    os.mkfifo(pool_dir / "4242.json")
    pool_dir.chmod(0o777)
    answer = await _get(jp_fetch, "pools")
    assert answer["pools"] == []
    assert answer["error"].startswith(
        f"The pool registry cannot be read: The pool registry folder {pool_dir} can be "
        "written by other users (mode drwxrwxrwx)"
    )
