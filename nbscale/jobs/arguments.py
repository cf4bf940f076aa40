"""What callers pass to nbscale.jobs, checked before the store is touched: each a JobError naming it and the fix."""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Mapping
from datetime import timedelta

from nbscale.errors import JobError
from nbscale.jobs.records import LARGEST_ID


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def job_id(value: object) -> int:
    """A job id as %jobs shows it: an int, or a string of digits (as a URL carries it)."""
    number: int | None = None
    if hasattr(value, "__index__") and not isinstance(value, bool):  # int, numpy integers
        number = operator.index(value)
    elif isinstance(value, str) and value.strip().isdigit() and value.strip().isascii():
        digits = value.strip()
        number = int(digits) if len(digits) <= 20 else None  # longer is past any id (and int() would refuse 4300+)
        if number is None:
            raise JobError(f"There is no job {_shown(value)}: job ids are the numbers %jobs shows.")
    elif isinstance(value, str):
        raise JobError(
            f"A job id is a number as %jobs shows it (like 3), not {_shown(value)}. To find a job by its "
            f"name, use nbscale.jobs.get(name={_shown(value)})."
        )
    if number is None:
        raise JobError(f"A job id is a number as %jobs shows it (like 3), not {type(value).__name__} {_shown(value)}.")
    if not 1 <= number <= LARGEST_ID:
        raise JobError(f"There is no job {_shown(number)}: job ids are the numbers %jobs shows, from 1.")
    return number


def job_name(value: object) -> str:
    if not isinstance(value, str):
        raise JobError(
            f"A job's name is a string (as given to %%batch --name), not {type(value).__name__} {_shown(value)}."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate ("a\udcff", from bytes decoded with surrogateescape)
        raise JobError(
            f"The job name {_shown(value)} holds {value[error.start]!r}, half of a character pair, "
            "which no file or database can store: give a name of whole characters."
        ) from None
    return value


def submission(code: object, name: object, namespace: object, cwd: object, env: object, cluster: object) -> None:
    """JobError for an argument of submit() of the wrong kind (pool and env values are checked by submit)."""
    if not isinstance(code, str):
        raise JobError(
            f"submit() takes the cell's code as a string, not {type(code).__name__} {_shown(code)}: "
            'e.g. nbscale.jobs.submit("net = train()", namespace=globals()).'
        )
    if "\x00" in code:
        raise JobError(
            "submit(): the cell's code holds a NUL character, which Python source cannot hold: "
            "remove it and submit again."
        )
    if name is not None:
        job_name(name)
    if namespace is not None and not isinstance(namespace, Mapping):
        raise JobError(
            f"submit(namespace=...) takes the notebook's variables as a dict (globals()), not "
            f"{type(namespace).__name__}."
        )
    if cwd is not None and not isinstance(cwd, str | os.PathLike):
        raise JobError(f"submit(cwd=...) takes a folder path, not {type(cwd).__name__} {_shown(cwd)}.")
    if cwd is not None and cluster is None and not os.path.isdir(cwd):  # a cluster's job runs in its node's folder
        raise JobError(
            f"submit(cwd={_shown(os.fspath(cwd))}): that folder does not exist; give the folder the job should run in."
        )
    if env is not None and not isinstance(env, Mapping):
        raise JobError(
            f"submit(env=...) takes a dict of environment variables ({{'KEY': 'value'}}), not {type(env).__name__}."
        )
    for key, value in (env or {}).items():
        if isinstance(key, str) and isinstance(value, str) and ("\x00" in key or "\x00" in value):
            raise JobError(
                f"--env {key.partition(chr(0))[0]}: an environment variable cannot hold a NUL "
                "character; remove it and submit again."
            )
    if cluster is not None and not isinstance(cluster, str):
        raise JobError(f"submit(cluster=...) takes a profile name or an address, not {type(cluster).__name__}.")


_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def age_s(value: object) -> float:
    """An age for `delete(older_than=...)` in seconds: a timedelta, or a number and a unit as `%jobs delete
    --older-than` takes it ('7d', '12h', '30m', '45s', '2w')."""
    written = _AGE.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif written is not None:
        seconds = float(written.group(1)) * _UNIT_S[written.group(2)]
    else:
        raise JobError(
            f"older_than takes an age such as '7d' (also '12h', '30m', '45s', '2w') or a "
            f"datetime.timedelta, not {_shown(value)}."
        )
    if seconds < 0:
        raise JobError(f"older_than must be an age of 0 or more, not {_shown(value)}.")
    return seconds
