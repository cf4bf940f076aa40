"""ImageDatastore on s3:// URLs against a real S3-compatible server (moto's server mode on 127.0.0.1).

Credentials and the endpoint come from the environment only (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL), in the notebook's process and, through `env=`, on pool workers; never in the datastore.
The server counts the requests it answers, by access key, method and path, so a test sees what the notebook
and the workers fetched.
"""

from __future__ import annotations

import collections
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import nbscale
from nbscale.data import ImageDatastore
from nbscale.data.reading import read_image
from tests.datasets import write_digits_pngs

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

BUCKET = "nbscale-digits"
SECRET_KEY = "s3-secret-that-must-not-travel-in-pickles"
PER_CLASS = 5
WORKER_KEY = "nbscale-worker-key"  # the access key pool workers use, so the server tells their requests apart


class CountingMotoServer(moto_server.ThreadedMotoServer):
    """moto's threaded server, counting each request it answers as (access key, method, path)."""

    def __init__(self) -> None:
        super().__init__(ip_address="127.0.0.1", port=0, verbose=False)
        self.requests: collections.Counter[tuple[str, str, str]] = collections.Counter()

    def _server_entry(self) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        app = DomainDispatcherApplication(create_backend_app)

        def counting(environ: dict[str, Any], start_response: Any) -> Any:
            key = re.search(r"Credential=([^/]+)/", environ.get("HTTP_AUTHORIZATION", ""))
            self.requests[(key.group(1) if key else "", environ["REQUEST_METHOD"], environ["PATH_INFO"])] += 1
            return app(environ, start_response)

        self._server = make_server(self._ip_address, self._port, counting, True, request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


SERVER: CountingMotoServer | None = None


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A moto S3 server on loopback holding digits PNGs under s3://nbscale-digits/digits/<class>/; yields its env."""
    global SERVER
    server = SERVER = CountingMotoServer()
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "nbscale-test-key",
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()  # an instance cached with other settings would be reused
        filesystem = s3fs.S3FileSystem()
        filesystem.mkdir(BUCKET)
        local = write_digits_pngs(tmp_path_factory.mktemp("s3-digits"), limit_per_class=PER_CLASS)
        filesystem.put(str(local) + "/", f"{BUCKET}/digits/", recursive=True)
        env["LOCAL_DIGITS"] = str(local)
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


def test_s3_url_lists_labels_and_reads_the_same_pixels_as_the_local_files(s3_env: dict[str, str]) -> None:
    ds = ImageDatastore(f"s3://{BUCKET}/digits")
    assert len(ds) == 10 * PER_CLASS and ds.classes == [str(d) for d in range(10)]
    assert ds.files[0].startswith(f"s3://{BUCKET}/digits/0/")
    assert set(ds.count_each_label().values()) == {PER_CLASS}
    image, label = ds[7]
    local_file = Path(s3_env["LOCAL_DIGITS"]) / ds.files[7].split("/digits/", 1)[1]
    assert image.shape == (1, 8, 8) and label == int(local_file.parent.name)
    assert torch.equal(read_image(ds.files[7]), read_image(str(local_file)))


def test_s3_datastore_pickles_small_and_without_credentials(s3_env: dict[str, str]) -> None:
    data = pickle.dumps(ImageDatastore(f"s3://{BUCKET}/digits"))
    assert len(data) < 100 * 10 * PER_CLASS  # file names and labels only
    for value in (s3_env["AWS_SECRET_ACCESS_KEY"], s3_env["AWS_ACCESS_KEY_ID"], s3_env["AWS_ENDPOINT_URL"]):
        assert value.encode() not in data


def test_missing_s3_prefix_is_a_datastore_error(s3_env: dict[str, str]) -> None:
    with pytest.raises(nbscale.DatastoreError, match="does not exist"):
        ImageDatastore(f"s3://{BUCKET}/no-such-prefix")


def _read_on_worker(ds: ImageDatastore) -> tuple[int, list[float], bool]:
    return len(ds), [ds[i][0].sum().item() for i in (0, 13, 49)], "AWS_SECRET_ACCESS_KEY" in os.environ


@pytest.mark.slow
def test_pool_worker_reads_s3_with_credentials_given_only_as_pool_env(
    s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = ImageDatastore(f"s3://{BUCKET}/digits")
    expected = [ds[i][0].sum().item() for i in (0, 13, 49)]
    credentials = {
        key: s3_env[key]
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")
    }
    for key in credentials:  # the workers must get them from env=, not by inheriting this process's environment
        monkeypatch.delenv(key)
    with nbscale.Pool(1, cpu=True, env=credentials) as pool:
        assert SECRET_KEY not in repr(pool)
        [(count, sums, had_secret)] = pool.run(_read_on_worker, ds)
    assert (count, sums, had_secret) == (10 * PER_CLASS, expected, True)


def _object_requests(key: str, method: str) -> collections.Counter[str]:
    """How often `key` asked for each object (bucket/key path) with `method`."""
    assert SERVER is not None
    return collections.Counter(
        {
            path: n
            for (who, how, path), n in SERVER.requests.items()
            if who == key and how == method and path.endswith(".png")
        }
    )


@pytest.mark.slow
def test_training_on_a_pool_reads_each_s3_object_once_in_all(s3_env: dict[str, str]) -> None:
    """Each worker reads a block of the training files and they share what they read; each validates on its own
    share; no object is asked for its size first (no HEAD). The notebook's checks read the first sample of each."""
    from nbscale.data import AugmentedImageDatastore

    train, val = ImageDatastore(f"s3://{BUCKET}/digits").split_each_label(0.7, randomize=True, seed=0)
    credentials = {key: s3_env[key] for key in ("AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")}
    with nbscale.Pool(2, cpu=True, env={**credentials, "AWS_ACCESS_KEY_ID": WORKER_KEY}):
        assert SERVER is not None
        SERVER.requests.clear()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        options = nbscale.TrainingOptions(
            "sgdm",
            execution_environment="parallel",
            max_epochs=3,
            mini_batch_size=10,
            validation_data=AugmentedImageDatastore((8, 8), val),
            verbose=False,
        )
        _, info = nbscale.train(model, AugmentedImageDatastore((8, 8), train), options)
    objects = [file.split("://", 1)[1] for file in train.files + val.files]
    # every object once, but the first of the training and validation data, which each worker's first-batch checks
    # (the layout and metrics checks) may read again: at most once more per worker
    expected = collections.Counter({f"/{path}": 1 for path in objects})
    got = _object_requests(WORKER_KEY, "GET")
    firsts = {f"/{train.files[0].split('://', 1)[1]}", f"/{val.files[0].split('://', 1)[1]}"}
    assert {path: n for path, n in got.items() if path not in firsts} == {
        path: n for path, n in expected.items() if path not in firsts
    }
    assert all(1 <= got[path] <= 3 for path in firsts), got
    assert _object_requests(WORKER_KEY, "HEAD") == collections.Counter()
    firsts = [train.files[0].split("://", 1)[1], val.files[0].split("://", 1)[1]]
    assert _object_requests(s3_env["AWS_ACCESS_KEY_ID"], "GET") == collections.Counter({f"/{p}": 1 for p in firsts})
    assert "on each of 2 workers, which read 1/2 of it each" in info.data_placement
    assert info.prepare_seconds > 0 and len(info.iteration) == 3 * (len(train) // 10)
