"""handler.priority: checked at start with the fix in the message; background puts every thread at SCHED_IDLE."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from handlers.errors import SettingsError
from handlers.priority import BACKGROUND, INTERACTIVE, priority_for, thread_policies
from handlers.settings import HandlerSettings

ROOT = Path(__file__).resolve().parents[3]


def run_child(code: str, **popen) -> str:
    """The last line a child Python printed; its stderr in the failure when it exits non-zero (imports from ROOT)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, **popen)
    assert done.returncode == 0, f"the child exited {done.returncode}:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


def settings(**handler) -> HandlerSettings:
    return HandlerSettings.from_yaml({"handler": {"task": "digit_classification", "model_file": "m.pt2", **handler}})


def test_bulk_lanes_are_background_and_the_others_interactive_when_the_setting_is_left_out():
    left_out = settings()
    assert left_out.priority_for("digits-bulk") == BACKGROUND
    assert left_out.priority_for("minilm-bulk") == BACKGROUND
    assert left_out.priority_for("digits") == INTERACTIVE
    assert left_out.priority_for(None) == INTERACTIVE


def test_a_per_lane_setting_wins_over_the_lanes_name_and_default_covers_lanes_not_named():
    chosen = settings(priority={"default": BACKGROUND, "digits-bulk": INTERACTIVE})
    assert chosen.priority_for("digits-bulk") == INTERACTIVE
    assert chosen.priority_for("digits") == BACKGROUND
    assert priority_for(INTERACTIVE, "digits-bulk") == INTERACTIVE


@pytest.mark.parametrize("value", ["low", {"digits-bulk": "idle"}, 3])
def test_an_unknown_priority_is_refused_with_the_values_allowed_and_an_example(value):
    with pytest.raises(SettingsError) as refused:
        settings(priority=value)
    message = str(refused.value)
    assert "handler.priority must be interactive or background" in message
    assert "priority: {default: interactive, digits-bulk: background}" in message
    if isinstance(value, dict):
        assert "for lane digits-bulk" in message


CHILD = """
import json, os, threading, torch
from handlers.priority import enter_background, thread_policies
before = threading.Thread(target=threading.Event().wait, daemon=True)
before.start()  # a thread that exists before the switch is switched too
switched = enter_background()
torch.set_num_threads(2)
a = torch.randn(256, 256)
(a @ a).sum()  # starts torch's intra-op pool after the switch
after = threading.Thread(target=threading.Event().wait, daemon=True)
after.start()
print(json.dumps({"switched": switched, "policies": thread_policies()}))
"""


def test_enter_background_puts_threads_that_exist_and_threads_started_later_at_sched_idle():
    # In a child: a thread at SCHED_IDLE may not come back to normal without privilege.
    import json

    last = run_child(CHILD)
    report = json.loads(last)
    policies = list(report["policies"].values())
    assert report["switched"] >= 2  # the main thread and the one started before
    assert len(policies) >= 4  # main, before, after and at least one torch pool thread
    assert set(policies) == {os.SCHED_IDLE}


def test_this_process_reads_its_own_threads_at_the_normal_policy():
    assert set(thread_policies().values()) == {os.SCHED_OTHER}


UNPRIVILEGED_CHILD = """
import json, os, threading
from handlers.priority import enter_background, thread_policies
threading.Thread(target=threading.Event().wait, daemon=True).start()
os.setgroups([]); os.setgid(65534); os.setuid(65534)  # as the pod's non-root user with every capability dropped
assert os.getuid() == 65534
enter_background()
print(json.dumps(sorted(set(thread_policies().values()))))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="drops root to an unprivileged user; this process is already one")
def test_an_unprivileged_process_without_capabilities_enters_idle_priority():
    assert run_child(UNPRIVILEGED_CHILD) == f"[{os.SCHED_IDLE}]"


SESSION_CHILD = """
import json
from pathlib import Path
from handlers.priority import enter_background
enter_background()
print(json.dumps(Path("/proc/self/autogroup").read_text()))
"""


def autogroup_nice(text: str) -> str:
    """The nice of an autogroup line ("/autogroup-12 nice 0"); the line is empty where autogroup is not in effect."""
    assert text.split()[1:2] == ["nice"], f"not an autogroup line: {text!r}"
    return text.split()[-1]


def own_autogroup() -> str:
    return Path("/proc/self/autogroup").read_text() if os.path.exists("/proc/self/autogroup") else ""


# The kernel groups by session only tasks in the root cpu cgroup: in a container or a systemd unit with a cpu cgroup
# of its own the file exists and reads empty (CI is such a machine), and there the session's nice means nothing.
@pytest.mark.skipif(not own_autogroup().strip(), reason="autogroup is not in effect for this process")
def test_a_background_process_leading_its_own_session_lowers_the_sessions_nice():
    import json

    leading = json.loads(run_child(SESSION_CHILD, start_new_session=True))
    if not leading.strip():
        pytest.skip("a new session's autogroup reads empty here: the kernel does not group it by session")
    assert autogroup_nice(leading) == "19"
    # A child in this session leaves the session's nice alone.
    assert autogroup_nice(json.loads(run_child(SESSION_CHILD))) == autogroup_nice(own_autogroup())


@pytest.mark.parametrize(("group", "lowered", "after"), [("/autogroup-7 nice 0\n", True, "19"), ("", False, "")])
def test_the_session_is_lowered_only_where_the_kernel_groups_it_by_session(tmp_path, monkeypatch, group, lowered, after):
    import handlers.priority as priority

    autogroup = tmp_path / "autogroup"
    autogroup.write_text(group)
    monkeypatch.setattr(priority, "AUTOGROUP", autogroup)
    monkeypatch.setattr(priority.os, "getsid", lambda pid: os.getpid())  # as the session's leader
    assert priority.lower_own_session() is lowered
    assert autogroup.read_text() == (after or group)


def test_a_process_that_does_not_lead_its_session_leaves_the_session_alone(tmp_path, monkeypatch):
    import handlers.priority as priority

    autogroup = tmp_path / "autogroup"
    autogroup.write_text("/autogroup-7 nice 0\n")
    monkeypatch.setattr(priority, "AUTOGROUP", autogroup)
    monkeypatch.setattr(priority.os, "getsid", lambda pid: os.getpid() + 1)
    assert priority.lower_own_session() is False
    assert autogroup.read_text() == "/autogroup-7 nice 0\n"
