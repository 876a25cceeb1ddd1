"""Every listener on loopback: in config.properties as read by ServerConfig, and on a live TorchServe."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import psutil

from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints

HTTP_ADDRESSES = ("inference_address", "management_address", "metrics_address")
GRPC_ADDRESSES = ("grpc_inference_address", "grpc_management_address")


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # Java listens on ::ffff:127.0.0.1
    return (mapped or address).is_loopback


def test_config_properties_binds_every_address_to_127_0_0_1():
    config = ServerConfig.read()
    hosts = {key: urlsplit(config.properties[key]).hostname for key in HTTP_ADDRESSES}
    hosts |= {key: config.properties[key] for key in GRPC_ADDRESSES}
    assert hosts == dict.fromkeys(HTTP_ADDRESSES + GRPC_ADDRESSES, "127.0.0.1")
    for key in (
        f"front_door_{name}_address" for name in ("inference", "management", "metrics", "grpc_inference", "grpc_management")
    ):
        assert config.properties[key].startswith("127.0.0.1:"), key
    endpoints = Endpoints.from_config()
    assert endpoints.grpc_host == "127.0.0.1"
    assert all(urlsplit(url).hostname == "127.0.0.1" for url in (endpoints.inference, endpoints.management, endpoints.metrics))


def test_the_running_server_listens_on_loopback_only(digits_server):
    """The frontend (java) and its workers, from config.properties' addresses: no socket on another interface."""
    launcher = psutil.Process(digits_server.server.process.pid)
    processes = [launcher, *launcher.children(recursive=True)]
    assert any(process.name() == "java" for process in processes)
    listening = [
        (process.name(), socket.laddr)
        for process in processes
        for socket in process.net_connections(kind="inet")
        if socket.status == psutil.CONN_LISTEN or socket.type == psutil.socket.SOCK_DGRAM
    ]
    assert [entry for entry in listening if not is_loopback(entry[1].ip)] == []
    e = digits_server.server.torchserve_endpoints
    configured = {urlsplit(url).port for url in (e.inference, e.management, e.metrics)}
    configured |= {e.grpc_inference_port, e.grpc_management_port}
    assert {address.port for name, address in listening if name == "java"} == configured
