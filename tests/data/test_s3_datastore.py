"""ImageDatastore on s3:// URLs against a real S3-compatible server (moto's server mode on 127.0.0.1).

Credentials and the endpoint come from the environment only (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL), in the notebook's process and, through `env=`, on pool workers; never in the datastore.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A moto S3 server on loopback holding digits PNGs under s3://nbscale-digits/digits/<class>/; yields its env."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
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


def test_pool_worker_reads_s3_with_credentials_given_only_as_pool_env(
    s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = ImageDatastore(f"s3://{BUCKET}/digits")
    expected = [ds[i][0].sum().item() for i in (0, 13, 49)]
    credentials = {key: s3_env[key] for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")}  # fmt: skip
    for (
        key
    ) in credentials:  # the workers must get them from env=, not by inheriting this process's environment
        monkeypatch.delenv(key)
    with nbscale.Pool(1, cpu=True, env=credentials) as pool:
        assert SECRET_KEY not in repr(pool)
        [(count, sums, had_secret)] = pool.run(_read_on_worker, ds)
    assert (count, sums, had_secret) == (10 * PER_CLASS, expected, True)
