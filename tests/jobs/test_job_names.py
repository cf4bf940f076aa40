"""A job name is checked before anything is created: a lone surrogate is a JobError, and no job folder is left."""

from __future__ import annotations

import os

import pytest

from nbscale.errors import JobError
from nbscale.jobs import list_jobs, submit


def test_a_name_with_a_lone_surrogate_is_refused_before_the_store_is_touched(job_store):
    before = sorted(os.listdir(job_store.root)) if os.path.isdir(job_store.root) else []
    with pytest.raises(JobError, match=r"The job name 'a\\udcff' holds '\\udcff', half of a character pair"):
        submit("x = 1", name="a\udcff", namespace={})
    after = sorted(os.listdir(job_store.root)) if os.path.isdir(job_store.root) else []
    assert after == before and list_jobs() == []
