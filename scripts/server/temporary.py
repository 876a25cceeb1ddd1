"""Throwaway TorchServes on free ports from a folder of their own, stopped on the way out (also on errors
or Ctrl-C): the integration tests, `make verify` and `make bench` all start theirs here."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from scripts.archive.reader import MarFile
from scripts.errors import ArchiveError
from scripts.server.config import FRONT_DOOR_LISTENERS, ServerConfig
from scripts.server.front_door import FrontDoor
from scripts.server.process import Server, free_port, free_ports


@contextlib.contextmanager
def serving_in(
    workdir: Path,
    archives: dict[str, Path],
    overrides: dict[str, str] | None = None,
    models: list[str] | None = None,
    front_door: bool = False,
    own_session: bool = True,
) -> Iterator[Server]:
    """TorchServe started from `workdir` with copies of `archives` ({file name: source}) as its model
    store, on free ports; yields once `models` (default: every lane it loads) are ready; always stopped. It loads
    config.properties' lanes of those archives only, unless `overrides` give load_models.
    `front_door`: nginx before it (scripts/server/front_door.py), where the server's endpoints then point."""
    store = workdir / "model_store"
    store.mkdir(parents=True, exist_ok=True)
    for name, source in archives.items():
        if not source.exists():
            raise ArchiveError(f"{source} is missing: run `make archive` first (make test does)")
        MarFile(source).copy(store / name)  # with its recorded sha256, so the copy can be registered
    ports = free_ports()
    if front_door:
        ports.update({f"front_door_{name}": free_port() for name in FRONT_DOOR_LISTENERS})
    source = ServerConfig.read()
    if "load_models" not in (overrides or {}):
        given = [f"{lane}={name}" for lane, name in source.loaded_lanes().items() if name in archives]
        overrides = {**(overrides or {}), "load_models": ",".join(given)}
    config = source.render(workdir / "config.properties", store, ports, overrides)
    server = Server(config=config, workdir=workdir, model_store=store)
    door = FrontDoor(config, workdir / "front-door") if front_door else None
    process = server.process = server.start(foreground=True, own_session=own_session)
    try:
        server.wait_ready(models if models is not None else ServerConfig.read(config).lanes(), process=process)
        if door is not None:
            door.start()
            server.front_door = door
        yield server
    finally:
        if door is not None:
            door.stop()
        server.stop(server.process)  # the one running now: a test may have restarted it


@contextlib.contextmanager
def temporary_server(
    archive: Path, name: str, overrides: dict[str, str] | None = None, front_door: bool = False
) -> Iterator[Server]:
    """Serve `archive` as model_store/`name` (<model>.mar) under the lanes config.properties gives that file (and no
    others)."""
    with tempfile.TemporaryDirectory(prefix="torchserve-") as folder:
        lanes = {**only_lanes_of(name), **(overrides or {})}
        with serving_in(Path(folder), {name: archive}, lanes, front_door=front_door) as server:
            yield server


def only_lanes_of(name: str) -> dict[str, str]:
    """A load_models override: config.properties' lanes served from archive `name`, and no others."""
    return ServerConfig.read().lanes_of_archive(name)
