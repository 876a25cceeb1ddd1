"""TorchServe from the GPU serving bundle (scripts/gpu/serving_bundle.py) on this CPU: its jlinked Java and slim
jar start the frontend and serve the digits lane, so the bundle carried to a GPU machine cannot rot unseen."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest
import requests

from scripts.clients.rest import predict
from scripts.gpu.serving_bundle import JAR, ensure_tree
from scripts.layout import ROOT
from tests.integration.conftest import start_server

DIGIT_7 = ROOT / "tests" / "fixtures" / "digit_7.png"


@pytest.fixture(scope="module")
def bundle():
    """The tree under build/gpu-serving, built once and reused while its inputs are unchanged."""
    tree, info = ensure_tree()
    return tree, info


@pytest.fixture(scope="module")
def bundled_server(bundle, tmp_path_factory):
    tree, _ = bundle
    # The environment start.sh gives TorchServe; the frontend and its workers inherit it at start.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JAVA_HOME", str(tree / "runtime"))
        env.setenv("PYTHONPATH", str(tree / "python"))
        env.setenv("PATH", f"{tree / 'bin'}{os.pathsep}{os.environ['PATH']}")
        running = start_server(
            tmp_path_factory.mktemp("torchserve-bundle"), ["digits.mar"], {"load_models": "digits=digits.mar"}, ["digits"]
        )
        server = next(running)
    yield server
    next(running, None)


def frontend_of(server) -> psutil.Process:
    [java] = [p for p in psutil.Process(server.server.process.pid).children(recursive=True) if p.name() == "java"]
    return java


def test_the_frontend_runs_on_the_bundles_java_and_jar(bundle, bundled_server):
    tree, _ = bundle
    java = frontend_of(bundled_server)
    assert Path(java.exe()).resolve() == (tree / "runtime" / "bin" / "java").resolve()
    command = java.cmdline()
    class_path = command[command.index("-cp") + 1]
    assert str(tree / JAR.parent) in class_path
    assert (tree / JAR).resolve() in {Path(f.path).resolve() for f in java.open_files()}


def test_the_bundled_frontend_serves_the_digit_seven(bundled_server):
    reply = predict(bundled_server.endpoints, "digits", DIGIT_7.read_bytes(), "image/png")
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["label"] == 7
    assert sum(body["scores"]) == pytest.approx(1.0, abs=1e-5)
    metrics = requests.get(f"{bundled_server.endpoints.metrics}/metrics", timeout=10)
    assert metrics.status_code == 200
    assert "ts_inference_requests_total" in metrics.text


def test_the_runtime_holds_only_the_frontends_modules(bundle):
    tree, info = bundle
    listed = subprocess.run(
        [str(tree / "runtime" / "bin" / "java"), "--list-modules"], capture_output=True, text=True, check=True
    )
    modules = sorted(line.split("@")[0] for line in listed.stdout.split())
    assert set(info.modules) <= set(modules)  # and what they require (java.datatransfer, java.prefs, ...)
    assert "java.desktop" in modules  # java.beans: the frontend dies at start without it
    assert not {"jdk.compiler", "jdk.jshell", "jdk.jdeps", "jdk.jlink", "java.net.http"} & set(modules)
    assert len(modules) < 25, modules  # of the JDK's 69


def test_start_sh_runs_commands_in_the_bundles_environment(bundle):
    tree, _ = bundle
    probe = "import os, ts; print(ts.__file__); print(os.environ['JAVA_HOME'])"
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYTHONPATH")}
    done = subprocess.run([str(tree / "start.sh"), "--exec", "python3", "-c", probe], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    ts_file, java_home = done.stdout.split()
    assert Path(ts_file) == tree / "python" / "ts" / "__init__.py"
    assert Path(java_home) == tree / "runtime"
    # The load generator of the GPU machine: the bundle's wrk, linked to the bundle's LuaJIT.
    wrk = subprocess.run(
        [str(tree / "start.sh"), "--exec", "sh", "-c", "command -v wrk; ldd $(command -v wrk)"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert wrk.stdout.splitlines()[0] == str(tree / "bin" / "wrk")
    [luajit] = [line for line in wrk.stdout.splitlines() if "libluajit" in line]
    assert f"=> {tree / 'lib'}/" in luajit


def test_start_sh_refuses_a_glibc_older_than_the_runtime_needs(bundle, tmp_path):
    tree, info = bundle
    assert info.glibc_needed.startswith("2.")
    script = (tree / "start.sh").read_text()
    assert f"NEED_GLIBC={info.glibc_needed}\n" in script
    copy = tmp_path / "start.sh"
    copy.write_text(script.replace(f"NEED_GLIBC={info.glibc_needed}", "NEED_GLIBC=2.999"))
    done = subprocess.run(["sh", str(copy), "--exec", "true"], capture_output=True, text=True)
    assert done.returncode == 3
    assert "needs glibc 2.999 or newer; this machine has 2." in done.stderr
