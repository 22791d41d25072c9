"""The http source: phone and watch apps POST sensor batches to the agent.

A real HTTP client (http.client, or a raw socket where the test needs to control the
bytes) against the real server on a free loopback port; the agent's side (poll, and
``committed`` after the commit) is played by the test, or is a real agent process
against a real Mosquitto."""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from edge_agent.agent import AgentCore, open_state
from edge_agent.config import ConfigError, HttpSourceConfig, parse_config
from edge_agent.sources import HttpSource, build_source
from edge_agent.sources.http import server as server_module
from tests.support import (
    LOOPBACK,
    REPO,
    AgentProcess,
    Subscriber,
    agent_config,
    child_env,
    free_port,
    run_module,
    wait_until,
    write_toml,
)
from tests.support.configs import commented_source
from tests.support.ports import HANG_GUARD_SECONDS

TOKEN = "phone-token-" + "7f3a" * 6
T0 = 1_763_780_000.25  # 2025-11-22, seconds since the epoch
SECRET = 72.123456  # a reading's value no answer may repeat


def write_token(tmp_path: Path, token: str = TOKEN) -> Path:
    path = tmp_path / "http-token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def source_settings(tmp_path: Path, **settings) -> dict:
    return {"name": "phone", "type": "http", "port": free_port(),
            "token_file": str(write_token(tmp_path)),
            "fields": {"heart_rate": "hr", "accel_x": "acc.x", "accel_y": "userAcceleration.y"},
            **settings}


@pytest.fixture
def start(tmp_path):
    """Start an http source with settings on top of ``source_settings``; stopped after
    the test."""
    started: list[HttpSource] = []

    def start_source(**settings) -> HttpSource:
        source = HttpSource(HttpSourceConfig(**source_settings(tmp_path, **settings)))
        source.start()
        assert source.error is None, source.error
        started.append(source)
        return source

    yield start_source
    for source in started:
        source.stop()


# -- a real client ----------------------------------------------------------------------------

@dataclass
class Answer:
    status: int
    document: dict
    headers: dict[str, str]

    @property
    def error(self) -> str:
        return self.document.get("error", "")


def post(port: int, body, *, token: str | None = TOKEN, path: str = "/readings",
         method: str = "POST", headers: dict | None = None, chunked: bool = False,
         timeout: float = 30) -> Answer:
    """One request with http.client; ``body``: a document (sent as JSON), bytes, or a
    tuple of chunks (sent chunked, without a Content-Length)."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, tuple):  # chunks
        body = iter(body)
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=sent, encode_chunked=chunked)
        response = connection.getresponse()
        return Answer(response.status, json.loads(response.read() or b"{}"),
                      {k.lower(): v for k, v in response.getheaders()})
    finally:
        connection.close()


def raw_request(port: int, head: str, body: bytes = b"") -> bytes:
    """Send exactly these bytes; everything the server answers until it closes."""
    with socket.create_connection((LOOPBACK, port), timeout=30) as connection:
        connection.sendall(head.replace("\n", "\r\n").encode() + body)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received


def records(n: int, start: float = T0, step: float = 0.25) -> dict:
    return {"readings": [{"time": start + i * step, "hr": 60 + i, "acc": {"x": 0.01 * i}}
                         for i in range(n)]}


class PlayedAgent:
    """The agent's side on a thread: poll, then ``committed``, every 10 ms (what
    AgentService.run does every batch_seconds); what it polled is kept."""

    def __init__(self, source: HttpSource):
        self.source = source
        self.polled = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.01):
            readings = self.source.poll(time.time())
            if len(readings):
                self.polled.append(readings)
            self.source.committed()

    def rows(self) -> int:
        return sum(len(r) for r in self.polled)

    def stop(self):
        self._stop.set()
        self._thread.join(HANG_GUARD_SECONDS)


@pytest.fixture
def agent_side():
    played: list[PlayedAgent] = []

    def play(source):
        played.append(PlayedAgent(source))
        return played[-1]

    yield play
    for agent in played:
        agent.stop()


# -- formats ------------------------------------------------------------------------------------

def test_records_arrive_with_their_fields_and_times(start, agent_side):
    source = start()
    agent = agent_side(source)
    nested = {"readings": [
        {"time": T0, "hr": 72, "acc": {"x": 0.5, "z": 9.0}, "note": "text is not a field"},
        {"time": T0 + 0.5, "hr": 73.5, "userAcceleration.y": -0.25},  # a key holding a dot
        {"time": T0 + 1.0, "steps": 12},  # none of the fields: skipped
    ]}
    answer = post(source.port, nested)
    assert (answer.status, answer.document) == (200, {"accepted": 2})
    bare = [{"time": T0 + 2.0, "hr": 80, "acc": {"x": -1}}]  # a bare list
    assert post(source.port, bare).document == {"accepted": 1}
    assert agent.rows() == 3  # answered: already polled and committed
    rows = {float(t): {name: float(column[i]) for name, column in r.fields.items()}
            for r in agent.polled for i, t in enumerate(r.times)}
    nan = math.nan
    expected = {T0: {"heart_rate": 72, "accel_x": 0.5, "accel_y": nan},
                T0 + 0.5: {"heart_rate": 73.5, "accel_x": nan, "accel_y": -0.25},
                T0 + 2.0: {"heart_rate": 80, "accel_x": -1, "accel_y": nan}}
    assert rows.keys() == expected.keys()
    for t, fields in expected.items():
        for name, value in fields.items():
            got = rows[t].get(name, nan)
            assert (math.isnan(value) and math.isnan(got)) or got == value, (t, name)
    counters = source.local_counters()
    assert (counters["accepted_requests"], counters["accepted_readings"],
            counters["skipped_readings"]) == (2, 3, 1)
    assert set(source.fields) == {"heart_rate", "accel_x", "accel_y"}


def test_a_timestamp_field_in_milliseconds(start, agent_side):
    source = start(timestamp_field="meta.t", timestamp_unit="ms")
    agent = agent_side(source)
    answer = post(source.port, [{"meta": {"t": 1_763_780_000_250}, "hr": 61}])
    assert answer.status == 200
    assert agent.polled[0].times.tolist() == [1_763_780_000.25]


def test_sensor_logger_pushes_arrive_as_readings(start, agent_side):
    # The app's HTTP push (PUSHING.md of tszheichoi/awesome-sensor-logger): time in ns.
    source = start(format="sensor-logger",
                   fields={"accel_x": "accelerometer.x", "accel_z": "accelerometer.z",
                           "wrist_ax": "wrist motion.accelerationX"})
    agent = agent_side(source)
    push = {"messageId": 7, "sessionId": "s-1", "deviceId": "d-1", "payload": [
        {"name": "accelerometer", "time": 1698501144401773000,
         "values": {"x": 0.061, "y": -0.001, "z": -0.104}},
        {"name": "gyroscope", "time": 1698501144401773000,
         "values": {"x": 1, "y": 2, "z": 3}},  # no field maps it: skipped
        {"name": "battery", "time": 1698501144500000000,
         "values": {"batteryLevel": 0.8, "batteryState": "charging", "lowPowerMode": False}},
        {"name": "wrist motion", "time": 1698501144411773000,
         "values": {"accelerationX": 0.25, "rotationRateX": 0.1}},
    ]}
    answer = post(source.port, push)
    assert (answer.status, answer.document) == (200, {"accepted": 2})
    readings = agent.polled[0]
    assert readings.times.tolist() == [1698501144.401773, 1698501144.411773]
    assert readings.fields["accel_x"][0] == 0.061 and readings.fields["accel_z"][0] == -0.104
    assert math.isnan(readings.fields["wrist_ax"][0]) and readings.fields["wrist_ax"][1] == 0.25
    assert math.isnan(readings.fields["accel_x"][1])
    assert source.local_counters()["skipped_readings"] == 2


# -- refusals: each its status, its reason counted, nothing else changed -----------------------

def _no_time(body):
    del body["readings"][1]["time"]
    return body


REFUSALS = [
    ("not JSON", b'{"readings": [', {}, 400, "bad_json"),
    ("NaN is not JSON", f'[{{"time": {T0}, "hr": NaN}}]'.encode(), {}, 400, "bad_json"),
    ("an object without readings", {"hr": SECRET}, {}, 400, "bad_shape"),
    ("a reading that is not an object", {"readings": [records(1)["readings"][0], 5]}, {}, 400,
     "bad_shape"),
    ("a value that is text", {"readings": [{"time": T0, "hr": str(SECRET)}]}, {}, 400,
     "bad_value"),
    ("a value that is a boolean", [{"time": T0, "hr": True}], {}, 400, "bad_value"),
    ("a value beyond floats", f'[{{"time": {T0}, "hr": 1e999}}]'.encode(), {}, 400,
     "bad_value"),
    ("a reading without its time", _no_time(records(3)), {}, 400, "bad_timestamp"),
    ("a time in ms read as seconds", [{"time": T0 * 1000, "hr": SECRET}], {}, 400,
     "bad_timestamp"),
    ("a time that is text", [{"time": "2025-11-22T03:33:20Z", "hr": SECRET}], {}, 400,
     "bad_timestamp"),
    ("no token", records(2), {"token": None}, 401, "unauthorized"),
    ("a wrong token", records(2), {"token": TOKEN[:-1] + "x"}, 401, "unauthorized"),
    ("the token as Basic", records(2), {"token": None,
                                        "headers": {"Authorization": f"Basic {TOKEN}"}},
     401, "unauthorized"),
    ("too many readings", records(11), {}, 413, "too_many_readings"),
    ("over max_body_bytes, with its Content-Length", {"readings": [], "pad": "x" * 3000}, {},
     413, "too_large"),
    ("over max_body_bytes, chunked (no Content-Length)",
     (b'{"readings": [], "pad": "', *[b"x" * 400] * 10, b'"}'), {"chunked": True}, 413,
     "too_large"),
    ("another path", records(1), {"path": "/"}, 404, "not_found"),
    ("another method", None, {"method": "GET"}, 405, "not_found"),
    ("a sensor-logger push to a records source", {"payload": []}, {}, 400, "bad_shape"),
]


@pytest.mark.parametrize("body,options,status,reason",
                         [case[1:] for case in REFUSALS], ids=[case[0] for case in REFUSALS])
def test_bad_requests_are_refused_counted_and_change_nothing(start, body, options, status,
                                                             reason):
    source = start(max_body_bytes=2048, max_readings=10)
    before = source.local_counters()
    answer = post(source.port, body, **options)
    assert answer.status == status, answer
    assert answer.headers["content-type"] == "application/json"
    assert answer.error and str(SECRET) not in answer.error and TOKEN not in answer.error
    after = source.local_counters()
    assert Counter(after["refused"]) - Counter(before["refused"]) == Counter({reason: 1})
    assert after["accepted_requests"] == 0 and after["queued_readings"] == 0
    assert len(source.poll(time.time())) == 0  # nothing reached the agent
    if status == 401:
        assert answer.headers["www-authenticate"] == "Bearer"


def test_a_body_declared_too_large_is_refused_before_it_is_sent(start):
    source = start(max_body_bytes=4096)
    # A Content-Length of a gigabyte and not one byte of body: the answer comes at once.
    answer = raw_request(source.port, f"POST /readings HTTP/1.1\nHost: phone\n"
                                      f"Authorization: Bearer {TOKEN}\n"
                                      f"Content-Length: 1000000000\n\n")
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert answer.split(b"\r\n\r\n", 1)[1] == b'{"error": "the body is over 4096 bytes"}'
    assert source.local_counters()["refused"]["too_large"] == 1


def test_an_unauthorised_sender_is_refused_before_its_body_is_read(start):
    source = start()
    answer = raw_request(source.port, "POST /readings HTTP/1.1\nHost: phone\n"
                                      "Content-Length: 1000000000\n\n")
    assert answer.startswith(b"HTTP/1.1 401 ")


def test_a_full_queue_answers_503_and_keeps_what_it_holds(start):
    source = start(queue_readings=4, max_readings=4)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, source.port, records(3))
        assert wait_until(lambda: source.local_counters()["queued_readings"] == 3, 10)
        second = post(source.port, records(2, start=T0 + 10))
        assert second.status == 503 and second.headers["retry-after"]
        assert source.local_counters()["refused"]["queue_full"] == 1
        readings = source.poll(time.time())
        assert readings.times.tolist() == [T0, T0 + 0.25, T0 + 0.5]  # the first request's
        source.committed()
        assert first.result(HANG_GUARD_SECONDS).status == 200
    # Room again: the second request, sent again, is taken.
    with ThreadPoolExecutor(1) as pool:
        again = pool.submit(post, source.port, records(2, start=T0 + 10))
        assert wait_until(lambda: source.local_counters()["queued_readings"] == 2, 10)
        assert len(source.poll(time.time())) == 2
        source.committed()
        assert again.result(HANG_GUARD_SECONDS).status == 200


# -- acknowledgement: 200 only once the batch that took the readings is committed -------------

def test_a_request_is_answered_only_after_its_batch_is_committed(start):
    source = start()
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post, source.port, records(3))
        assert wait_until(lambda: source.local_counters()["queued_readings"] == 3, 10)
        source.committed()  # a commit of a batch that did not take them: no answer yet
        readings = source.poll(time.time())  # the agent takes them ...
        assert len(readings) == 3
        time.sleep(0.5)
        assert not answer.done()  # ... and the answer waits for the commit
        source.committed()
        assert answer.result(HANG_GUARD_SECONDS).status == 200
    assert source.local_counters()["accepted_readings"] == 3


def test_a_batch_that_was_not_committed_is_not_acknowledged(start):
    source = start()
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post, source.port, records(2))
        assert wait_until(lambda: source.local_counters()["queued_readings"] == 2, 10)
        assert len(source.poll(time.time())) == 2
        # The next poll comes without a commit in between: that batch's commit failed.
        assert len(source.poll(time.time())) == 0
        result = answer.result(HANG_GUARD_SECONDS)
    assert result.status == 503 and "send it again" in result.error
    assert source.local_counters()["refused"]["not_recorded"] == 1


def test_a_timeout_before_the_agent_takes_the_readings_withdraws_them(start):
    source = start(commit_timeout_seconds=0.3)
    answer = post(source.port, records(2))  # nobody polls
    assert answer.status == 503 and answer.error.startswith("the agent did not take")
    assert len(source.poll(time.time())) == 0  # withdrawn: a resend duplicates nothing
    assert source.local_counters()["refused"]["not_committed"] == 1


def test_a_timeout_while_the_batch_is_being_committed_says_a_resend_may_duplicate(start):
    source = start(commit_timeout_seconds=3)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post, source.port, records(2))
        assert wait_until(lambda: source.local_counters()["queued_readings"] == 2, 10)
        assert len(source.poll(time.time())) == 2  # taken; the commit never comes in time
        result = answer.result(HANG_GUARD_SECONDS)
    assert result.status == 503 and "recorded twice" in result.error
    source.committed()  # late: nobody waits any more


def test_a_sender_that_hangs_up_has_its_readings_withdrawn(start):
    source = start()
    body = json.dumps(records(2)).encode()
    address = (LOOPBACK, source.port)
    with socket.create_connection(address, timeout=HANG_GUARD_SECONDS) as connection:
        connection.sendall(f"POST /readings HTTP/1.1\r\nHost: phone\r\nAuthorization: Bearer "
                           f"{TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        assert wait_until(lambda: source.local_counters()["queued_readings"] == 2, 10)
    assert wait_until(lambda: source.local_counters()["refused"]["disconnected"] == 1, 10)
    assert len(source.poll(time.time())) == 0


def test_stopping_answers_what_the_last_batch_took_and_refuses_the_rest(start):
    source = start()
    port = source.port
    with ThreadPoolExecutor(2) as pool:
        taken = pool.submit(post, port, records(2))
        assert wait_until(lambda: source.local_counters()["queued_readings"] == 2, 10)
        assert len(source.poll(time.time())) == 2  # the agent's last tick takes these ...
        late = pool.submit(post, port, records(1, start=T0 + 5))  # ... not this one
        assert wait_until(lambda: source.local_counters()["queued_readings"] == 1, 10)
        source.committed()
        source.stop()
        assert taken.result(HANG_GUARD_SECONDS).status == 200
        refused = late.result(HANG_GUARD_SECONDS)
    assert refused.status == 503 and refused.headers["retry-after"]
    assert source.local_counters()["refused"]["stopping"] == 1
    with pytest.raises(OSError):  # and the port is closed
        post(port, records(1), timeout=5)


def test_connections_are_capped_and_must_send_their_request_in_time(start, monkeypatch):
    monkeypatch.setattr(server_module, "MAX_CONNECTIONS", 3)
    monkeypatch.setattr(server_module, "REQUEST_SECONDS", 60.0)
    source = start()
    idle = [socket.create_connection((LOOPBACK, source.port), timeout=30) for _ in range(3)]
    try:
        assert wait_until(lambda: source.open_connections == 3, 10)
        refused = raw_request(source.port, "")  # one more: 503 at once
        assert refused.startswith(b"HTTP/1.1 503 ") and b"too many connections" in refused
        # A connection must bring its whole request within REQUEST_SECONDS.
        guard = source._server.guard
        guard.limits = dataclasses.replace(guard.limits, request_seconds=0.2)
        idle.pop().close()
        assert wait_until(lambda: source.open_connections == 2, 10)
        with socket.create_connection((LOOPBACK, source.port), timeout=30) as slow:
            slow.sendall(b"POST /readings HTTP/1.1\r\nHost: phone\r\n")  # and no more
            answer = b""
            while chunk := slow.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 ")
    finally:
        for connection in idle:
            connection.close()
    counters = source.local_counters()["refused"]
    assert (counters["connections"], counters["timeout"]) == (1, 1)
    assert wait_until(lambda: source.open_connections == 0, 10)
    agent = PlayedAgent(source)
    try:
        assert post(source.port, records(1)).status == 200  # room again
    finally:
        agent.stop()


# -- with the agent -------------------------------------------------------------------------------

def test_the_agent_acknowledges_after_every_commit_even_when_it_reports_nothing(tmp_path):
    """AgentCore + the real state file: a channel whose report_interval drops all but
    one reading still lets every request through, once the tick is committed."""
    data = agent_config(state_dir=tmp_path / "state",
                        sources=[source_settings(tmp_path, fields={"heart_rate": "hr"})],
                        channels=[{"name": "hr", "source": "phone", "field": "heart_rate",
                                   "kind": "linear", "epsilon": 1.0, "domain": [0, 250],
                                   "report_interval": 3600}])
    config = parse_config(data)
    (tmp_path / "state").mkdir()
    store = open_state(config)
    core = AgentCore(config, store)
    core.start()
    try:
        source = core.sources["phone"]
        with ThreadPoolExecutor(2) as pool:
            answers = [pool.submit(post, source.port, records(4, start=T0 + 10 * i))
                       for i in range(2)]
            assert wait_until(lambda: source.local_counters()["queued_readings"] == 8, 10)
            core.tick(time.time())
            assert [a.result(HANG_GUARD_SECONDS).status for a in answers] == [200, 200]
        assert store.spooled == 1  # one report: report_interval dropped the other seven
        assert core.local_status()["sources"]["phone"]["accepted_readings"] == 8
    finally:
        core.stop()
        store.close()


def test_an_agent_without_an_http_source_loads_no_server_stack():
    code = ("import sys\n"
            "import edge_agent.agent, edge_agent.cli, edge_agent.fleet\n"
            "from edge_agent.config import SyntheticSourceConfig\n"
            "from edge_agent.sources import build_source\n"
            "build_source(SyntheticSourceConfig(name='imu', type='synthetic'), agent_id='a')\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'starlette', 'uvicorn', 'h11', 'anyio'}))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, env=child_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- configuration -----------------------------------------------------------------------------

def config_with(tmp_path, **settings) -> dict:
    return agent_config(state_dir=tmp_path / "state",
                        sources=[source_settings(tmp_path, **settings)],
                        channels=[{"name": "hr", "source": "phone", "field": "heart_rate",
                                   "kind": "linear", "epsilon": 1.0, "domain": [0, 250]}])


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "192.168.1.20",
                                  "10.0.0.7", "172.16.4.1", "169.254.10.2", "fe80::1",
                                  "fd12:3456::1"])
def test_hosts_on_the_local_network_are_accepted(tmp_path, host):
    assert parse_config(config_with(tmp_path, host=host)).sources[0].host == host


@pytest.mark.parametrize("host,message", [
    ("0.0.0.0", "not every interface, got '0.0.0.0'"),
    ("::", "not every interface, got '::'"),
    ("8.8.8.8", "must be a loopback, private or link-local address"),
    ("2001:4860:4860::8888", "must be a loopback, private or link-local address"),
    ("::ffff:8.8.8.8", "must be a loopback, private or link-local address"),
    ("224.0.0.251", "must be a loopback, private or link-local address"),
    ("255.255.255.255", "must be a loopback, private or link-local address"),
    ("phone.local", "must be an IP address"),
    ("", "must be an IP address"),
])
def test_other_hosts_are_refused_naming_the_key(tmp_path, host, message):
    with pytest.raises(ConfigError) as info:
        parse_config(config_with(tmp_path, host=host))
    assert str(info.value).startswith("sources[0].host: ") and message in str(info.value)


@pytest.mark.parametrize("settings,top,message", [
    ({"fields": {}}, {}, "sources[0].fields: must map at least one field"),
    ({"fields": {"heart_rate": "."}}, {}, "sources[0].fields: heart_rate = '.': must be a key"),
    ({"format": "sensor-logger", "fields": {"heart_rate": "hr"}}, {},
     "sources[0].fields: heart_rate = 'hr': with format = 'sensor-logger', '<sensor name>."),
    ({"format": "sensor-logger", "fields": {"heart_rate": "heart.bpm"},
      "timestamp_field": "t"}, {}, "sources[0].timestamp_field: not with format = "),
    ({"timestamp_unit": "h"}, {}, "sources[0].timestamp_unit: must be one of"),
    ({"max_readings": 100, "queue_readings": 50}, {},
     "sources[0].queue_readings: must be >= max_readings (100), got 50"),
    ({"max_body_bytes": 100}, {}, "sources[0].max_body_bytes: must be >= 1024"),
    ({"commit_timeout_seconds": 2}, {"batch_seconds": 5},
     "sources[0].commit_timeout_seconds: must exceed batch_seconds (5)"),
    ({"token": "x"}, {}, "sources[0].token: is not a known key"),
    ({"format": "csv"}, {}, "sources[0].format: must be one of"),
])
def test_http_settings_are_checked_naming_the_key(tmp_path, settings, top, message):
    data = config_with(tmp_path, **settings)
    data.update(top)
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert message in str(info.value)


def test_a_channel_may_read_only_the_mapped_fields(tmp_path):
    data = config_with(tmp_path, fields={"pulse": "hr"})
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert "channels[0]: source 'phone' has no field 'heart_rate' (it has: pulse)" \
        in str(info.value)


def test_the_token_file_is_checked_at_start_up_naming_the_key(tmp_path):
    data = config_with(tmp_path, token_file=str(tmp_path / "no-token"))
    config = parse_config(data)
    assert config.files_read() == {"sources[0].token_file": tmp_path / "no-token"}
    path = write_toml(tmp_path / "agent.toml", data)
    result = run_module("edge_agent", "run", "--config", str(path))
    assert result.returncode == 78 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [
        f"{path}: invalid configuration: sources[0].token_file: cannot read "
        f"{tmp_path / 'no-token'} (No such file or directory)"]


@pytest.mark.parametrize("token", ["", "short-token", "two words in a token file"])
def test_a_token_too_short_or_with_spaces_fails_the_source(tmp_path, token):
    settings = source_settings(tmp_path)
    settings["token_file"] = str(write_token(tmp_path, token))
    source = build_source(HttpSourceConfig(**settings), agent_id="w1")
    source.start()
    try:
        assert source.finished and "at least 16 characters without spaces" in source.error
        assert token == "" or token not in source.error
    finally:
        source.stop()


def test_the_sample_configs_http_example_is_valid():
    """The commented [[sources]] example of type http in configs/agent.toml, uncommented,
    is a valid source (with a channel reading one of its fields)."""
    source = commented_source("http")
    config = HttpSourceConfig(**source)
    assert config.type == "http" and config.fields and config.token_file.is_absolute()


# -- end to end: an agent killed in the middle of a stream loses nothing it acknowledged ------

class Phone:
    """Posts batches of readings, one request at a time, resending each until it gets a
    200 (what a sensor-logging app does); counts what was acknowledged and sent."""

    def __init__(self, port: int, *, start: float, per_request: int = 20):
        self.port = port
        self.start = start
        self.per_request = per_request
        self.acknowledged = 0  # readings of requests answered 200
        self.sent = 0  # readings of every attempt, resends included
        self.statuses: Counter[int | str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        batch = 0
        while not self._stop.is_set():
            body = records(self.per_request, start=self.start + batch * 10, step=0.01)
            self.sent += self.per_request
            try:
                status = post(self.port, body, timeout=HANG_GUARD_SECONDS).status
            except OSError:  # refused while the agent is down, reset when it is killed
                status = "no answer"
            self.statuses[status] += 1
            if status == 200:
                self.acknowledged += self.per_request
                batch += 1
            else:
                self._stop.wait(0.05)  # and resend the same batch

    def stop(self):
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


def ledger_reports(state_dir: Path) -> int:
    db = sqlite3.connect(f"file:{state_dir}/state.sqlite?mode=ro", uri=True)
    try:
        return db.execute("SELECT COALESCE(SUM(reports), 0) FROM spending").fetchone()[0]
    finally:
        db.close()


def test_an_agent_killed_mid_stream_loses_nothing_it_acknowledged(tmp_path, mosquitto):
    """Three phones post to one agent, each resending until it gets a 200; the agent is
    killed (SIGKILL) while they post, and restarted.  Every acknowledged reading is in a
    report: an agent that answered before its commit would lose those of the batch in
    progress (up to a second of three phones' requests)."""
    port = free_port()
    sources = [source_settings(tmp_path, port=port, fields={"heart_rate": "hr"})]
    channels = [{"name": "hr", "source": "phone", "field": "heart_rate", "kind": "linear",
                 "epsilon": 1.0, "domain": [0, 250]}]
    config = write_toml(tmp_path / "agent.toml", agent_config(
        state_dir=tmp_path / "state", broker=mosquitto, batch_seconds=1.0, sources=sources,
        channels=channels))
    subscriber = Subscriber(mosquitto, "ldp/v1/demo/+/+")
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    phones = [Phone(port, start=T0 + 100_000 * i) for i in range(3)]

    def acknowledged() -> int:
        return sum(phone.acknowledged for phone in phones)

    try:
        assert wait_until(lambda: acknowledged() >= 200, 90), agent.output()
        agent.process.send_signal(signal.SIGKILL)  # in the middle of the stream
        agent.wait(HANG_GUARD_SECONDS)
        at_kill = acknowledged()
        agent = AgentProcess(config, tmp_path / "agent.log").start()
        assert wait_until(lambda: acknowledged() >= at_kill + 200, 90), agent.output()
    finally:
        for phone in phones:
            phone.stop()
    assert agent.terminate() == 0, agent.output()
    statuses = sum((phone.statuses for phone in phones), Counter())
    assert statuses["no answer"] >= 1, statuses  # the kill did cut requests
    reports = ledger_reports(tmp_path / "state")

    def unique() -> dict:  # by channel and seq: a redelivery counts once
        return {(m["channel"], m["seq"]): m for m in subscriber.reports()}

    assert subscriber.wait_for(
        lambda: sum(len(m["codes"]) for m in unique().values()) >= reports, 30)
    messages = unique()
    assert sorted(seq for _, seq in messages) == list(range(len(messages)))  # no seq gap
    reported = sum(len(m["codes"]) for m in messages.values())
    assert reported == reports  # every report charged reached the broker
    # Nothing acknowledged is lost; what is more is resends of unanswered requests only.
    sent = sum(phone.sent for phone in phones)
    assert acknowledged() <= reported <= sent, (statuses, agent.output())
    subscriber.close()
