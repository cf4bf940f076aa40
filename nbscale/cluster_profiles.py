"""Cluster profiles: `~/.config/nbscale/profiles.toml` names a backend and an address.

```toml
[profiles.lab]
backend = "ray"
address = "ray://head.example.org:10001"
gpus_per_worker = 1
env = { NCCL_SOCKET_IFNAME = "eth0" }
runtime_env = { pip = ["torchvision"] }
job_address = "http://head.example.org:8265"   # Ray's job server, for %%batch --cluster (this is the default)
job_python = "/shared/venv/bin/python"         # the Python that runs batch jobs there (default: the kernel's)
connect_timeout = 180                          # seconds to reach the cluster and start the pool's actors
```
`%pool start 16 --cluster lab` uses it; `--cluster ray://HOST:PORT` (or `HOST:PORT`) needs no profile.
`NBSCALE_PROFILES` overrides the file's path. Pools (nbscale.pool.backends.cluster) and batch jobs
(nbscale.jobs.backends.cluster) both read them, so they live beside both packages, in neither.
"""

from __future__ import annotations

import math
import numbers
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from platformdirs import user_config_path

from nbscale.errors import PoolError
from nbscale.slurm_profile import SlurmProfile, slurm_profile
from nbscale.trust import others_could_change

BACKENDS = ("ray", "slurm")
MAX_CONNECT_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class ClusterProfile:
    """Where and how to start a cluster pool's workers."""

    name: str
    backend: str
    address: str
    gpus_per_worker: float = 0
    env: dict[str, str] = field(default_factory=dict)
    runtime_env: dict[str, Any] = field(default_factory=dict)
    job_address: str = ""
    job_python: str = ""
    connect_timeout: float | None = None  # seconds; None: the pool's default
    slurm: SlurmProfile | None = None  # backend "slurm": what to ask SLURM for (then address is empty)


def profiles_path() -> Path:
    """`$NBSCALE_PROFILES`, else profiles.toml in the user's config folder (`$XDG_CONFIG_HOME/nbscale`, by default
    ~/.config/nbscale, on Linux)."""
    override = os.environ.get("NBSCALE_PROFILES")
    if override:
        return Path(override)
    return user_config_path("nbscale", appauthor=False) / "profiles.toml"


def _looks_like_address(text: str) -> bool:
    if text.startswith(("ray://", "http://", "https://")) or text == "auto":
        return True
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit()


def read_profiles() -> dict[str, dict[str, Any]]:
    path = profiles_path()
    if not path.exists():
        return {}
    untrusted = others_could_change(path)
    if untrusted:  # a profile names the Python that runs batch jobs and the workers' environment: code, in effect
        raise PoolError(
            f"The cluster profiles file {path} is not used: {untrusted}, so someone else could choose "
            "what runs as you (job_python, env). Make it and its folders yours alone (chmod go-w) or "
            "point NBSCALE_PROFILES at a file of your own."
        )
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise PoolError(f"Cannot read the cluster profiles in {path}: {error}. Fix the TOML and try again.") from None
    return cast("dict[str, dict[str, Any]]", document.get("profiles", document))


def resolve_cluster(cluster: str) -> ClusterProfile:
    """A profile by name, or an ad-hoc Ray profile for an address like ray://HOST:PORT or HOST:PORT."""
    if _looks_like_address(cluster):
        return ClusterProfile(name=cluster, backend="ray", address=cluster)
    profiles = read_profiles()
    if cluster not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        raise PoolError(
            f"--cluster {cluster!r} is neither an address (ray://HOST:PORT) nor a profile in {profiles_path()} "
            f"(profiles there: {known}). Add a [profiles.{cluster}] table with backend and address, or pass the "
            "address."
        )
    entry = profiles[cluster]
    backend = entry.get("backend", "ray")
    if backend not in BACKENDS:
        raise PoolError(f"Profile {cluster!r} names backend {backend!r}; nbscale supports {', '.join(BACKENDS)}.")
    if backend == "slurm":
        return _slurm_cluster(cluster, entry)
    if "address" not in entry:
        raise PoolError(f'Profile {cluster!r} in {profiles_path()} has no address: add address = "ray://HOST:PORT".')
    return ClusterProfile(
        name=cluster,
        backend=backend,
        address=str(entry["address"]),
        gpus_per_worker=float(entry.get("gpus_per_worker", 0)),
        env={str(k): str(v) for k, v in entry.get("env", {}).items()},
        runtime_env=dict(entry.get("runtime_env", {})),
        job_address=str(entry.get("job_address", "")),
        job_python=str(entry.get("job_python", "")),
        connect_timeout=checked_connect_timeout(
            entry.get("connect_timeout"), f"connect_timeout in profile {cluster!r} of {profiles_path()}"
        ),
    )


def _slurm_cluster(name: str, entry: dict[str, Any]) -> ClusterProfile:
    """A slurm profile: Ray runs inside the allocation, so its address is known only once SLURM started it."""
    slurm = slurm_profile(name, entry, str(profiles_path()))
    return ClusterProfile(
        name=name,
        backend="slurm",
        address="",
        gpus_per_worker=slurm.gpus_per_worker,
        env={str(k): str(v) for k, v in entry.get("env", {}).items()},
        connect_timeout=checked_connect_timeout(
            entry.get("connect_timeout"), f"connect_timeout in profile {name!r} of {profiles_path()}"
        ),
        slurm=slurm,
    )


def checked_connect_timeout(seconds: Any, name: str) -> float | None:
    """`seconds` as a float between 1 and MAX_CONNECT_TIMEOUT_S (None stays None); PoolError naming `name`."""
    if seconds is None:
        return None
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, numbers.Real)
        or math.isnan(seconds)
        or not 1 <= float(seconds) <= MAX_CONNECT_TIMEOUT_S
    ):
        raise PoolError(
            f"{name} must be a number of seconds from 1 to {MAX_CONNECT_TIMEOUT_S:.0f}, such as 120, not {seconds!r}."
        )
    return float(seconds)
