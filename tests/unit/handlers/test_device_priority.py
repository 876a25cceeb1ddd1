"""A lane's GPU priority: MPS client priority below normal for background lanes, a CUDA stream per priority."""

from __future__ import annotations

import pytest
import torch

from handlers.device_priority import HIGH_STREAM_PRIORITY, MPS_CLIENT_PRIORITY, enter_device_priority, mps_environment
from handlers.lane_signal import device_name
from handlers.priority import BACKGROUND, INTERACTIVE


def test_background_lanes_are_mps_clients_below_normal_and_interactive_ones_keep_the_default():
    assert mps_environment(BACKGROUND) == {MPS_CLIENT_PRIORITY: "1"}
    assert mps_environment(INTERACTIVE) == {}


def test_no_stream_is_made_on_the_cpu():
    assert enter_device_priority(torch.device("cpu"), BACKGROUND) is None


def test_each_device_has_its_own_signal():
    assert device_name(torch.device("cpu")) == "cpu"
    assert device_name(torch.device("cuda:1")) == "cuda1"
    assert device_name(torch.device("cuda")) == "cuda0"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("priority", "expected"), [(INTERACTIVE, HIGH_STREAM_PRIORITY), (BACKGROUND, 0)])
def test_the_passes_run_on_a_stream_of_the_lanes_priority(priority, expected):
    device = torch.device("cuda:0")
    stream = enter_device_priority(device, priority)
    try:
        assert torch.cuda.current_stream(device) == stream
        assert stream.priority == expected
    finally:
        torch.cuda.set_stream(torch.cuda.default_stream(device))
