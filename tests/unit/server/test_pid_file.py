"""A throwaway server's folder may hold the pid file of the last TorchServe started there: TorchServe refuses to start
while it names any live process or thread, so Server drops it unless it names a running frontend."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from scripts.server.process import FRONTEND_CLASS, PID_FILE, Server


def server_in(tmp_path) -> Server:
    return Server(config=tmp_path / "config.properties", workdir=tmp_path, model_store=tmp_path / "model_store")


def stand_in_frontend(seconds: float) -> subprocess.Popen:
    """A process with the frontend's class on its command line, returned once it runs it (after exec: before, its
    /proc cmdline is still the parent's)."""
    frontend = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})", FRONTEND_CLASS.decode()])
    deadline = time.monotonic() + 10
    while FRONTEND_CLASS not in Path(f"/proc/{frontend.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the stand-in frontend did not start"
        time.sleep(0.01)
    return frontend


def stale_after(server: Server, pid: int) -> bool:
    pid_file = server._tmpdir() / PID_FILE
    pid_file.write_text(str(pid))
    server._clear_pid_file()
    return not pid_file.exists()


def test_a_pid_file_naming_no_frontend_is_dropped(tmp_path):
    server = server_in(tmp_path)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert stale_after(server, int(finished.stdout))  # an exited process
    assert stale_after(server, os.getpid())  # a live process that is not a frontend
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert thread.native_id != os.getpid() and os.path.exists(f"/proc/{thread.native_id}/status")
        assert stale_after(server, thread.native_id)  # a thread's id, which TorchServe's check takes for a process
    finally:
        release.set()
        thread.join()
    (server._tmpdir() / PID_FILE).write_text("not a number")
    server._clear_pid_file()
    assert not (server._tmpdir() / PID_FILE).exists()


def test_a_new_server_waits_for_the_last_frontend_of_its_folder_to_exit(tmp_path):
    server = server_in(tmp_path)
    frontend = stand_in_frontend(0.6)
    (server._tmpdir() / PID_FILE).write_text(str(frontend.pid))
    started = time.monotonic()
    threading.Thread(target=frontend.wait).start()  # reaped as it exits, as the launcher's parent does
    server._clear_pid_file(wait_s=10)
    assert 0.3 < time.monotonic() - started < 5 and not (server._tmpdir() / PID_FILE).exists()


def test_a_pid_file_naming_a_running_frontend_is_kept(tmp_path):
    server = server_in(tmp_path)
    frontend = stand_in_frontend(60)
    try:
        assert not stale_after(server, frontend.pid)
    finally:
        frontend.kill()
        frontend.wait()
    assert stale_after(server, frontend.pid)
