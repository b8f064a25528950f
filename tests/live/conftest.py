"""Recordings shared by several live test modules (docs/testing.md, "What is shared").

A session fixture records once per process; every test using it carries
`pytest.mark.xdist_group(<its group>)`, so under `--dist loadgroup` one worker runs
them all and the recording is made once in the whole run."""

from __future__ import annotations

from typing import Any

import pytest

from tests.record_helpers import (
    SharedRecording,
    live_skip_reason,
    record_api_stacks,
    record_dlopen_twin,
)


@pytest.fixture(scope="session")
def api_stacks(tmp_path_factory: pytest.TempPathFactory) -> SharedRecording:
    """tests.record_helpers.record_api_stacks: the stack-walk, --stack-depth and
    unwinder programs in one recording with default options (group API_STACKS_GROUP)."""
    from tests.standin_cuda.standin_cuda import StandinCudaUnavailable

    reason = live_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    try:
        return record_api_stacks(tmp_path_factory.mktemp("api-stacks"))
    except StandinCudaUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def dlopen_twin(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The trace of `record -p` of the twin that dlopen()s libcuda after the recorder is
    ready (tests.record_helpers.record_dlopen_twin), default options: the API
    layer's dlopen test and the library-load test of the default hook mechanism assert
    on it (group DLOPEN_TWIN_GROUP)."""
    from tests.standin_cuda.standin_cuda import StandinCudaUnavailable

    reason = live_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    try:
        return record_dlopen_twin(tmp_path_factory.mktemp("dlopen-twin") / "trace")
    except StandinCudaUnavailable as e:
        pytest.skip(str(e))
