"""The /nbscale/api/ endpoints through a real Jupyter server: auth, GPUs, pools, jobs."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
import types

import pytest
from tornado.httpclient import HTTPClientError

from nbscale.pool import registry
from nbscale.server import handlers
from tests.nvml_probe import nvml_works

ENDPOINTS = [("GET", "gpus"), ("GET", "pools"), ("GET", "jobs"), ("GET", "jobs/1/log"), ("POST", "jobs/1/cancel")]


async def _json(jp_fetch, *path: str, **kwargs) -> dict:
    response = await jp_fetch("nbscale", "api", *path, **kwargs)
    assert response.code == 200
    return json.loads(response.body)


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
async def test_every_endpoint_answers_403_without_the_token(jp_fetch, method, path):
    body = b"{}" if method == "POST" else None
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("nbscale", "api", *path.split("/"), method=method, body=body, headers={"Authorization": ""})
    assert refused.value.code == 403


@pytest.mark.skipif(nvml_works(), reason="this machine has an NVIDIA driver")
async def test_gpus_without_a_gpu_is_a_clear_no_gpu_answer_not_an_error(jp_fetch):
    answer = await _json(jp_fetch, "gpus")
    assert answer == {"gpus": [], "message": "No GPU: the NVIDIA driver was not found on this machine."}


async def test_gpus_name_each_gpus_holder_from_the_machine_wide_registry(jp_fetch, monkeypatch, tmp_path):
    """What the panel's GPUs section shows: another notebook's pool holds GPU 0 of two (stand-in NVML)."""
    import pwd

    from tests.gpu_holder import gpu_holder
    from tests.nvml_probe import fake_pynvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("NBSCALE_GPU_REGISTRY", str(tmp_path))
    with gpu_holder(["GPU-aaaa0-1111"], notebook="analysis.ipynb") as holder:
        first, second = (await _json(jp_fetch, "gpus"))["gpus"]
    [held] = first["holders"]
    assert {key: held[key] for key in ("user", "pid", "purpose", "notebook", "mine")} == {
        "user": pwd.getpwuid(os.geteuid()).pw_name,
        "pid": holder.pid,
        "purpose": "pool",
        "notebook": "analysis.ipynb",
        "mine": True,
    }
    assert second["holders"] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a second user needs root")  # CI runs as root
async def test_another_users_reservation_naming_this_kernel_is_not_marked_as_the_servers_users(jp_fetch, monkeypatch):
    """A file planted by another user claims this server's kernel and pid: the panel must not call it its own."""
    import shutil
    import signal
    import tempfile
    from pathlib import Path

    from tests.nvml_probe import fake_pynvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    folder = Path(tempfile.mkdtemp(prefix="nbscale-gpu-registry-", dir="/tmp"))  # reachable by the other user
    folder.chmod(0o1777)
    monkeypatch.setenv("NBSCALE_GPU_REGISTRY", str(folder))
    planted = folder / "nbscale-gpu.GPU-aaaa0-1111.0123456789abcdef"
    claim = json.dumps({"pid": 0, "purpose": "pool", "kernel_id": "the-kernel-in-front", "notebook": "mine.ipynb"})
    claim = claim.replace('"pid": 0', "\"pid\": '$$'")  # the other user's live shell, which `exec sleep` keeps
    other = subprocess.Popen(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            f"echo '{claim}' > {planted} && exec sleep 60",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            [held] = (await _json(jp_fetch, "gpus"))["gpus"][0]["holders"] or [None]
            if held is not None:
                break
            assert time.monotonic() < deadline and other.poll() is None, "the other user's reservation never showed"
            await asyncio.sleep(1.1)  # the server reads the registry at most once a second
        assert (held["uid"], held["kernel_id"], held["mine"]) == (65534, "the-kernel-in-front", False)
    finally:
        if other.poll() is None:
            os.killpg(other.pid, signal.SIGKILL)
        other.wait()
        shutil.rmtree(folder)


async def test_gpu_cache_reads_nvml_once_per_max_age():
    reads = []

    def read() -> dict:
        reads.append(1)
        return {"gpus": [], "message": f"read {len(reads)}"}

    cached = handlers.GpuCache(read, max_age_s=3600)
    assert [await cached.get() for _ in range(3)] == [{"gpus": [], "message": "read 1"}] * 3
    fresh = handlers.GpuCache(read, max_age_s=0)
    await fresh.get()
    await fresh.get()
    assert len(reads) == 3


def _exited_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _write_pool_file(folder, pid: int, heartbeat: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{pid}.json").write_text(
        json.dumps({"kernel_id": f"k{pid}", "size": 1, "pid": pid, "heartbeat": heartbeat})
    )


async def test_pools_lists_live_pools_and_drops_dead_or_silent_ones(jp_fetch, pool_dir):
    assert await _json(jp_fetch, "pools") == {"pools": []}
    worker = {"rank": 0, "host": "here", "pid": 1, "device": "cpu", "state": "idle", "memory_mb": 12.5}
    registry.publish({"kernel_id": "abc", "size": 1, "kind": "cpu", "backend": "local", "workers": [worker]})
    dead = _exited_pid()
    _write_pool_file(pool_dir, dead, time.time())
    silent_parent = os.getppid()  # alive, but its heartbeat is older than registry.STALE_AFTER_S
    _write_pool_file(pool_dir, silent_parent, time.time() - registry.STALE_AFTER_S - 1)

    pools = (await _json(jp_fetch, "pools"))["pools"]
    assert [(p["kernel_id"], p["pid"], p["workers"]) for p in pools] == [("abc", os.getpid(), [worker])]
    assert sorted(path.name for path in pool_dir.glob("*.json")) == [f"{os.getpid()}.json"]
    registry.withdraw()
    assert await _json(jp_fetch, "pools") == {"pools": []}


async def test_jobs_is_an_empty_list_where_nbscale_jobs_is_missing(jp_fetch, monkeypatch):
    monkeypatch.setattr(handlers, "jobs_module", lambda: None)
    assert await _json(jp_fetch, "jobs") == {"jobs": [], "available": False}
    with pytest.raises(HTTPClientError) as missing:
        await jp_fetch("nbscale", "api", "jobs", "3", "cancel", method="POST", body=b"{}")
    assert missing.value.code == 404


@pytest.fixture
def fake_jobs(monkeypatch):
    from nbscale.errors import JobError

    cancelled: list[int] = []
    fake = types.ModuleType("nbscale.jobs")
    fake.list_jobs = lambda: [{"id": 3, "name": "long run", "state": "running", "elapsed_s": 12.5, "results": []}]

    def get(job_id: int) -> types.SimpleNamespace:
        if job_id != 3:
            raise JobError(f"There is no job {job_id}.")
        text = "epoch 1\n" + "x" * handlers.LOG_TAIL_CHARS + "\nepoch 2\n"
        return types.SimpleNamespace(log=lambda tail=None: text if tail is None else text[-tail:])

    def cancel(job_id: int) -> bool:
        get(job_id)
        cancelled.append(job_id)
        return True

    fake.get, fake.cancel = get, cancel
    monkeypatch.setattr(handlers, "jobs_module", lambda: fake)
    return cancelled


async def test_jobs_lists_cancels_and_shows_the_end_of_a_log(jp_fetch, fake_jobs):
    answer = await _json(jp_fetch, "jobs")
    assert answer["available"] and [job["id"] for job in answer["jobs"]] == [3]
    log = await _json(jp_fetch, "jobs", "3", "log")
    assert log["truncated"] and log["log"].endswith("\nepoch 2\n") and "epoch 1" not in log["log"]
    assert await _json(jp_fetch, "jobs", "3", "cancel", method="POST", body=b"{}") == {"id": 3, "cancelled": True}
    assert fake_jobs == [3]
    with pytest.raises(HTTPClientError) as missing:
        await jp_fetch("nbscale", "api", "jobs", "9", "cancel", method="POST", body=b"{}")
    assert missing.value.code == 404 and b"There is no job 9." in missing.value.response.body


async def test_jobs_reads_the_real_job_store_where_nbscale_jobs_exists(jp_fetch, tmp_path, monkeypatch):
    if handlers.jobs_module() is None:
        pytest.skip("nbscale.jobs with list_jobs() is not installed here")
    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path))
    assert await _json(jp_fetch, "jobs") == {"jobs": [], "available": True}


@pytest.mark.slow
async def test_a_real_batch_job_is_listed_logged_and_cancelled(jp_fetch, tmp_path, monkeypatch):
    jobs = handlers.jobs_module()
    if jobs is None or not callable(getattr(jobs, "submit", None)):
        pytest.skip("nbscale.jobs with submit() is not installed here")
    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path))
    job = jobs.submit("print('started', flush=True)\nimport time\ntime.sleep(60)", name="sleeper", cwd=tmp_path)
    deadline = time.monotonic() + 60
    while "started" not in (await _json(jp_fetch, "jobs", str(job.id), "log"))["log"]:
        assert time.monotonic() < deadline, "the job did not start within a minute"
        await asyncio.sleep(0.2)
    listed = (await _json(jp_fetch, "jobs"))["jobs"]
    assert [(j["id"], j["name"], j["state"]) for j in listed] == [(job.id, "sleeper", "running")]
    assert await _json(jp_fetch, "jobs", str(job.id), "cancel", method="POST", body=b"{}") == {
        "id": job.id,
        "cancelled": True,
    }
    assert (await _json(jp_fetch, "jobs"))["jobs"][0]["state"] == "cancelled"


@pytest.mark.slow
async def test_a_running_jobs_training_is_listed_as_strict_json_with_epoch_iteration_loss_and_time_left(
    jp_fetch, tmp_path, monkeypatch
):
    jobs = handlers.jobs_module()
    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # a learn rate that makes the loss blow up: the training ends at a loss that is not finite
    job = jobs.submit(
        "import time, nbscale\nfrom tests.training.digits import digits, tiny_net\n(x, y), _ = digits()\n"
        "opts = nbscale.TrainingOptions('sgdm', initial_learn_rate=1e12, max_epochs=3, mini_batch_size=32, "
        "verbose=False)\n"
        "net, info = nbscale.train(tiny_net(), (x, y), opts)\nprint('trained', flush=True)\ntime.sleep(60)\n",
        name="diverges",
        cwd=repo,
    )
    deadline = time.monotonic() + 120
    while "trained" not in job.log():
        assert time.monotonic() < deadline and job.state in ("queued", "running"), job.log()
        await asyncio.sleep(0.2)
    response = await jp_fetch("nbscale", "api", "jobs")
    answer = json.loads(response.body, parse_constant=lambda name: pytest.fail(f"{name} is not strict JSON"))
    [listed] = answer["jobs"]
    training = listed["training"]
    assert training["training"] == 1 and training["trainings"] == 1
    assert (training["epoch"], training["max_epochs"], training["total_iterations"]) == (1, 3, 3 * 46)
    assert training["loss"] is None  # not finite: null, never NaN
    assert training["done"] and training["time_left_s"] == 0 and "Training loss is" in training["stop_reason"]
    job.cancel()


async def test_a_browser_cancel_needs_the_xsrf_token_beside_its_login_cookie(
    jp_fetch, jp_http_port, jp_base_url, jp_serverapp, fake_jobs
):
    """A page on another site can make the browser send Jupyter's login cookie, not the XSRF token: such a POST is
    refused and cancels nothing; with the token (as JupyterLab's ServerConnection sends it) it cancels."""
    from tornado.httpclient import AsyncHTTPClient

    client, root = AsyncHTTPClient(), f"http://127.0.0.1:{jp_http_port}{jp_base_url}"
    login = await client.fetch(f"{root}api/status?token={jp_serverapp.identity_provider.token}")
    cookies = {}
    for header in login.headers.get_list("Set-Cookie"):
        name, _, rest = header.partition("=")
        cookies[name] = rest.split(";")[0]
    assert any(name.startswith("username-") for name in cookies), cookies  # logged in, as the browser is
    cookie = "; ".join(f"{name}={value}" for name, value in cookies.items())
    xsrf = secrets.token_hex(16)  # tornado's double submit: the X-XSRFToken header must match the _xsrf cookie
    cookie += f"; _xsrf={xsrf}"
    url = f"{root}nbscale/api/jobs/3/cancel"

    refused = await client.fetch(url, method="POST", body=b"{}", headers={"Cookie": cookie}, raise_error=False)
    assert refused.code == 403 and fake_jobs == []

    accepted = await client.fetch(
        url, method="POST", body=b"{}", headers={"Cookie": cookie, "X-XSRFToken": xsrf}, raise_error=False
    )
    assert accepted.code == 200 and json.loads(accepted.body) == {"id": 3, "cancelled": True}
    assert fake_jobs == [3]
