"""`edge-collector demo` headless: embedded broker, collector, 24 simulated wearables."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

from ..agent.e2e import REPO
from ..conftest import free_port
from .test_e2e_collector import wait_until

CHANNELS = {"accel_x", "accel_y", "accel_z", "roll", "pitch", "yaw", "accel_polar"}


def test_demo_runs_everything_and_estimates_match_the_simulated_truth(tmp_path):
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "collector", "demo", "--agents", "24", "--duration", "45",
         "--http-port", str(port), "--embedded", "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    url = f"http://127.0.0.1:{port}/api/channels"

    def api():
        import urllib.request

        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())

    try:
        assert wait_until(lambda: len([a for a in api()["agents"].values()
                                       if a["values"] > 0]) == 24
                          and set(api()["channels"]) == CHANNELS
                          and min(c["count"] for c in api()["channels"].values()) > 1500, 60), \
            (tmp_path / "collector.log").read_text()[-2000:]
        document = api()
        truth = json.loads((tmp_path / "truth.json").read_text())
        assert sorted(document["agents"]) == sorted(f"wearable-{i}" for i in range(24))
        assert document["agents_online"] == 24 and not document["ingest"]["rejects"]
        for name in ("accel_x", "accel_y", "accel_z"):
            mean = document["channels"][name]["mean"]
            # the truth file may be one batch ahead of the collector: slack of 0.02
            assert abs(mean["estimate"] - truth[name]["mean"]) <= \
                5 * mean["stderr"] + mean["bias_bound"] + 0.02, (name, mean, truth[name])
        for name in ("roll", "pitch"):  # concentrated angles: the direction is well defined
            channel = document["channels"][name]
            error = math.remainder(channel["circular_mean"] - truth[name]["mean_direction_rad"],
                                   2 * math.pi)
            assert abs(error) < 0.25, (name, channel["circular_mean"], truth[name])
            assert abs(channel["resultant_length"]["estimate"]
                       - truth[name]["resultant_length"]) < 0.2
        output, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.terminate()
            demo.wait(60)
    assert demo.returncode == 0, output[-3000:]
    assert "Dashboard: http://127.0.0.1:" in output and "embedded amqtt broker" in output
    assert "estimate vs simulated truth" in output
    # everything it started has stopped: the API is gone, the collector checkpointed
    time.sleep(1)
    try:
        api()
        raise AssertionError("the collector still answers after the demo ended")
    except OSError:
        pass
    assert "exited early" not in output


def test_ctrl_c_stops_the_demo_and_everything_it_started(tmp_path):
    import os
    import signal

    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "collector", "demo", "--agents", "3", "--http-port", str(port),
         "--embedded", "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    url = f"http://127.0.0.1:{port}/api/channels"

    def agents():
        import urllib.request

        with urllib.request.urlopen(url, timeout=5) as response:
            return len(json.loads(response.read())["agents"])

    try:
        assert wait_until(lambda: agents() == 3, 60)
        demo.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
        output, _ = demo.communicate(timeout=90)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, output[-3000:]
    # the children ran in their own sessions (a terminal's Ctrl-C reaches only the
    # demo, which stops them in order); none is left
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
    assert not os.path.exists(tmp_path / "truth.tmp")
