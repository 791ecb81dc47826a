"""A port another process holds: the server exits 1 and its log names the plane, the port and the key."""
from __future__ import annotations

import socket

from tests.server_utils import ServerProcess, write_config


def test_address_in_use_names_the_plane_and_the_port(tmp_path, tiny_model):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        srv = ServerProcess(write_config(tmp_path / "config.json", tiny_model, server={"managementPort": port}),
                            tmp_path / "server.log").start()
        try:
            assert srv.proc.wait(120) == 1
        finally:
            srv.stop()
    log = srv.log()
    assert "Address already in use" in log
    assert f"the management plane's port {port} on 127.0.0.1 (ServerConfig.managementPort)" in log, log
