"""fcp.profiling.spawn: results come back, failures and hangs raise with exit codes."""

from __future__ import annotations

import pytest

from fcp.profiling.spawn import free_port, run_group

from ._launch_targets import answer, fail_on_rank_1, hang


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert 1024 <= port <= 65535


def test_run_group_returns_rank0_result_and_checks_failures_and_hangs():
    got = run_group(answer, 2, 41, timeout_s=60, what="answer")
    assert got["world"] == 2 and got["value"] == 41 and got["port"] > 0
    with pytest.raises(RuntimeError, match=r"fail: process exit codes \[0, 3\]"):
        run_group(fail_on_rank_1, 2, timeout_s=60, what="fail")
    # killed at the 3 s deadline (SIGKILL: -9), not waited for: hang() would exit 0 after 60 s
    with pytest.raises(RuntimeError, match=r"hang: process exit codes \[-9, -9\].*result missing"):
        run_group(hang, 2, timeout_s=3, what="hang")
