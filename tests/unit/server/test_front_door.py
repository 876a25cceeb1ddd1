"""The front door's config (scripts/server/front_door.py), rendered from config.properties and the model configs, and
checked by nginx itself; where clients are sent when a config names a front door."""

from __future__ import annotations

import re
import subprocess

import pytest

from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints
from scripts.server.front_door import (
    Gateway,
    _refused_variable,
    bulk_admitted,
    front_door_addresses,
    lane_body_bytes,
    lane_media,
    lane_rules,
    nginx_binary,
    render,
    torchserve_addresses,
)
from scripts.server.process import free_ports

ROUTE = re.compile(r"location ~ \^/predictions/([\w-]+)\(/\[\^/\]\*\)\?\$ \{(.*?)\n        \}", re.DOTALL)


@pytest.fixture(scope="module")
def config():
    return ServerConfig.read()


def routes(text: str) -> dict[str, str]:
    return dict(ROUTE.findall(text))


def test_make_serve_sends_clients_to_the_front_door_and_torchserve_listens_elsewhere(config):
    door, own = front_door_addresses(config), torchserve_addresses(config)
    assert set(door) == {"inference", "management", "metrics", "grpc_inference", "grpc_management"}
    assert not set(door.values()) & set(own.values())
    endpoints, direct = Endpoints.from_config(), Endpoints.from_config(direct=True)
    assert endpoints.inference == f"http://{door['inference']}" and direct.inference == f"http://{own['inference']}"
    assert f"{endpoints.grpc_host}:{endpoints.grpc_inference_port}" == door["grpc_inference"]
    assert f"127.0.0.1:{endpoints.grpc_management_port}" == door["grpc_management"]


def test_every_lane_has_its_route_with_its_own_byte_limit_and_the_bulk_lanes_their_admission(config):
    text = render(config, front_door_addresses(config), torchserve_addresses(config))
    found = routes(text)
    assert sorted(found) == sorted(config.loaded_lanes())
    for lane, archive in config.loaded_lanes().items():
        body = found[lane]
        assert f"client_max_body_size {lane_body_bytes(config, lane, archive)};" in body
        assert f"if (${_refused_variable(lane_media(config, lane, archive))})" in body and "return 415" in body
        if lane.endswith("-bulk"):
            assert f"limit_conn bulk {bulk_admitted(config, lane)};" in body
        else:
            assert "limit_conn bulk" not in body
    assert (
        lane_body_bytes(config, "digits", "digits.mar")
        < config.max_request_size
        == lane_body_bytes(config, "digits-bulk", "digits.mar")
    )
    assert [rule.admitted is None for rule in lane_rules(config)] == [not lane.endswith("-bulk") for lane in config.lanes()]


def accepted_by(text: str, media: tuple[str, ...]):
    refused_map = re.search(rf"map \$content_type \${_refused_variable(media)} \{{(.*?)\}}", text, re.DOTALL).group(1)
    patterns = [re.compile(p.replace("\\\\", "\\"), re.IGNORECASE) for p in re.findall(r'"~\*(.*?)" 0;', refused_map)]
    return lambda content_type: content_type == "" or any(p.search(content_type) for p in patterns)


def test_each_lane_takes_the_contracts_types_and_its_tasks_raw_bodies_and_no_form(config):
    text = render(config, front_door_addresses(config), torchserve_addresses(config))
    digits, minilm = (
        accepted_by(text, lane_media(config, "digits", "digits.mar")),
        accepted_by(text, lane_media(config, "minilm", "minilm.mar")),
    )
    common = ("application/json", "application/json; charset=utf-8", "application/vnd.instances+json", "application/x-npy",
              "application/octet-stream", "")  # fmt: skip
    for ok in common:
        assert digits(ok) and minilm(ok), ok
    assert digits("image/png") and digits("image/jpeg") and not digits("text/plain")
    assert minilm("text/plain; charset=utf-8") and not minilm("image/png")
    for refused in ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonp",
                    "text/html, application/x-www-form-urlencoded", "application/xml"):  # fmt: skip
        assert not digits(refused) and not (minilm(refused) and not refused.startswith("text/")), refused


def test_each_listener_is_served_and_grpc_speaks_http2(config):
    door = front_door_addresses(config)
    text = render(config, door, torchserve_addresses(config))
    for name, address in door.items():
        assert f"listen {address}{' http2' if name.startswith('grpc') else ''} reuseport;" in text
    assert "grpc_pass grpc://torchserve_grpc_inference;" in text and "proxy_pass http://torchserve_management;" in text
    assert "client_header_timeout 10s;" in text and "proxy_request_buffering on;" in text


@pytest.mark.parametrize("mode", ["serve", "gateway"])
def test_nginx_accepts_the_rendered_config(config, tmp_path, mode):
    nginx = nginx_binary()
    if mode == "serve":
        text = render(config, front_door_addresses(config), torchserve_addresses(config))
    else:
        modules = nginx.resolve().parents[1] / "lib" / "nginx" / "modules"
        text = render(config, {}, {}, gateway=Gateway(modules=str(modules)))
        (tmp_path / "gateway.js").write_text(
            "function f(r) { return '1'; }\nexport default { clientAllowed: f, torchserveAuthorization: f };\n"
        )
    (tmp_path / "nginx.conf").write_text(text)
    checked = subprocess.run(
        [str(nginx), "-t", "-p", f"{tmp_path}/", "-c", str(tmp_path / "nginx.conf"), "-e", "stderr", "-g", "daemon off;"],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr


def test_a_rendered_test_server_config_has_a_front_door_only_where_ports_are_given_for_it(config, tmp_path):
    ports = free_ports()
    plain = ServerConfig.read(config.render(tmp_path / "plain.properties", tmp_path, ports))
    assert front_door_addresses(plain) == {}
    assert Endpoints.from_config(plain.path).inference == f"http://127.0.0.1:{ports['inference']}"
    door_ports = {
        f"front_door_{name}": 40000 + i
        for i, name in enumerate(("inference", "management", "metrics", "grpc_inference", "grpc_management"))
    }
    fronted = ServerConfig.read(config.render(tmp_path / "door.properties", tmp_path, {**ports, **door_ports}))
    assert front_door_addresses(fronted)["inference"] == "127.0.0.1:40000"
    assert Endpoints.from_config(fronted.path).inference == "http://127.0.0.1:40000"
    assert Endpoints.from_config(fronted.path, direct=True).inference == f"http://127.0.0.1:{ports['inference']}"


def test_the_front_door_waits_as_long_as_torchserve_may_take_on_every_lane():
    """TorchServe answers a lane within its archive's responseTimeout (wall clock, every lane of the archive); a bulk
    chunk starved by the stream lanes may take that long, and nginx giving up first would answer it 504 while its
    worker still runs it."""
    from models.registry import models
    from scripts.server.front_door import UPSTREAM_TIMEOUT_S

    timeouts = {name: int(found.handler_config()["responseTimeout"]) for name, found in models().items()}
    assert timeouts and all(UPSTREAM_TIMEOUT_S > seconds for seconds in timeouts.values()), (UPSTREAM_TIMEOUT_S, timeouts)
