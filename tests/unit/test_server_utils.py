"""The test harness itself: a shared server that died fails loudly instead of being replaced, ports from
free_port can be bound by a server (SO_REUSEADDR) and are not handed out again, a port clash restarts."""
from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from tests import server_utils
from tests.server_utils import PortInUse, free_port, launch, shared_server


def test_a_dead_shared_server_fails_the_test_with_its_log(request, monkeypatch, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("Traceback: the engine blew up\n")
    dead = server_utils.ServerProcess.__new__(server_utils.ServerProcess)
    dead.proc, dead.log_path = SimpleNamespace(poll=lambda: 1, returncode=1), log
    monkeypatch.setitem(server_utils._SERVERS, "dead", dead)
    with pytest.raises(pytest.fail.Exception, match="(?s)died.*the engine blew up"):
        shared_server("dead", request, lambda tmp: pytest.fail("must not start a replacement"))


def test_free_ports_are_distinct_and_bindable_by_a_server():
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20
    port = ports.pop()
    with socket.socket() as s:  # what Tornado's bind_sockets does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(1)
    handed_out = set()
    for _ in range(200):  # the kernel's own choices avoid the reserved ports
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            handed_out.add(s.getsockname()[1])
    assert not handed_out & ports


def test_launch_starts_again_on_fresh_ports_after_a_clash():
    made = []

    class Fake:
        def __init__(self, clash: bool) -> None:
            self.clash, self.stopped = clash, False

        def start(self) -> "Fake":
            return self

        def wait_ready(self) -> "Fake":
            if self.clash:
                raise PortInUse("Address already in use")
            return self

        def stop(self) -> None:
            self.stopped = True

    def make() -> Fake:
        made.append(Fake(clash=not made))
        return made[-1]

    assert launch(make) is made[1] and made[0].stopped
    with pytest.raises(PortInUse):
        launch(lambda: Fake(clash=True))
