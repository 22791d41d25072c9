"""``edge-collector watch``: the pure render() and the polling loop against a
real WebServer fed by FakeSource."""

from __future__ import annotations

import copy
import io
import re
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from rich.console import Console

import collector.tools.watch as watch_module
from collector.api.server import WebServer
from collector.cli import main
from collector.tools.watch import channels_url, fmt, fmt_count, render, watch
from edge_agent import protocol
from tests.support import free_port
from tests.support.fake_source import FakeSource, empty_linear_channel


def text_of(renderable, width: int = 200) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


@pytest.fixture
def source():
    return FakeSource()


@pytest.fixture
def server(source):
    web = WebServer(source, host="127.0.0.1", port=0, push_seconds=0.2).start()
    yield web
    web.stop()


def row(text: str, name: str) -> str:
    """The line of the table that starts with a channel (or axis) name."""
    lines = [line for line in text.splitlines() if line.strip().startswith(name + " ")]
    assert lines, f"no row for {name}:\n{text}"
    return lines[0]


# -- formatting -----------------------------------------------------------------

@pytest.mark.parametrize("value, shown", [
    (0.037328136, "0.03733"), (-0.2742, "-0.2742"), (1.0, "1"), (0, "0"),
    (12345.6, "12,350"), (1.5e-5, "0.000015"), (-6.788e-4, "-0.0006788"),
    (1.2e7, "12,000,000"), (-1.23456e-9, "-0.000000001235"), (9.99996, "10"),
    (123, "123"), (None, "–"), (float("nan"), "–"), (float("inf"), "–"), ("x", "–"),
    (True, "–"),
])
def test_fmt(value, shown):
    assert fmt(value) == shown


def test_fmt_never_writes_an_exponent():
    for exponent in range(-12, 13):
        for mantissa in (1.0, -2.5, 9.87654):
            text = fmt(mantissa * 10.0 ** exponent)
            assert not re.search(r"[eE]", text), (mantissa, exponent, text)
            assert float(text.replace(",", "")) == pytest.approx(mantissa * 10.0 ** exponent,
                                                                 rel=1e-3)


def test_fmt_count():
    assert fmt_count(15500) == "15,500"
    assert fmt_count(None) == "–"


def test_every_kind_of_the_protocol_is_shown():
    assert set(watch_module.KIND_ROWS) == set(protocol.KINDS)
    rows = watch_module._rows("x", {"kind": "spiral", "count": 1})
    assert rows == [("x", "spiral", "1", "–", "", "kind 'spiral' not shown", "–")]


def test_channels_url():
    assert channels_url("http://h:8080") == "http://h:8080/api/channels"
    assert channels_url("http://h:8080/") == "http://h:8080/api/channels"
    assert channels_url("127.0.0.1:8080") == "http://127.0.0.1:8080/api/channels"
    assert channels_url("https://proxy/ldp/") == "https://proxy/ldp/api/channels"


# -- render -------------------------------------------------------------------------

def test_render_shows_every_channel_and_its_numbers(source):
    document = source.channels_json()
    text = text_of(render(document))
    channels = document["channels"]

    assert "fleet demo" in text
    assert "24/25 agents online" in text
    assert f"{document['ingest']['messages']:,} messages" in text
    assert "rejects 3 (schema 1, bad_code 2) · broker connected" in text

    linear = row(text, "accel_x")
    mean = channels["accel_x"]["mean"]
    for cell in ("linear", "15,500", "24",
                 f"{fmt(mean['estimate'])} ± {fmt(mean['stderr'])} g (s.e.)",
                 f"[{fmt(mean['ci95'][0])}, {fmt(mean['ci95'][1])}] g", "inversion"):
        assert cell in linear, cell

    circular = row(text, "roll")
    roll = channels["roll"]
    length = roll["resultant_length"]
    for cell in ("circular",
                 f"μ {fmt(roll['circular_mean'])} ± {fmt(roll['direction']['half_width'])} rad "
                 "(95% half-width)",
                 f"R {fmt(length['estimate'])} [{fmt(length['ci95'][0])}, "
                 f"{fmt(length['ci95'][1])}]",
                 f"raw {fmt(length['raw'])}", f"σ {fmt(roll['circular_std'])} rad"):
        assert cell in circular, cell

    polar = channels["accel_polar"]
    assert f"|v| {fmt(polar['mean_vector']['magnitude'])} g ∠ " \
           f"{fmt(polar['mean_vector']['direction'])} rad" in row(text, "accel_polar")
    radius = polar["radius"]["mean"]
    assert f"{fmt(radius['estimate'])} ± {fmt(radius['stderr'])} g (s.e.)" in row(text, "radius")
    assert "!near an end" in row(text, "radius") and "!near an end" not in linear
    assert f"μ {fmt(polar['angle']['circular_mean'])} ± " \
           f"{fmt(polar['angle']['direction']['half_width'])} rad (95% half-width)" \
           in row(text, "angle")

    vector = channels["accel"]
    assert "1 of 3 axes per reading" in row(text, "accel")
    for axis, stats in vector["axes"].items():
        line = [ln for ln in text.splitlines() if ln.startswith(f"    {axis} ")][0]
        assert f"{stats['count']:,}" in line
        assert f"{fmt(stats['mean']['estimate'])} ± {fmt(stats['mean']['stderr'])} g (s.e.)" \
            in line


def test_render_shows_units_and_never_an_exponent(source):
    """Tiny and huge means in plain decimals; a channel without a unit shows none."""
    tiny = empty_linear_channel()
    tiny["unit"] = "Pa"
    tiny["mean"].update(estimate=-6.788e-4, stderr=1.234e-5, ci95=[-7.03e-4, -6.546e-4],
                        method="inversion")
    huge = empty_linear_channel()
    huge["mean"].update(estimate=1.2e7, stderr=3.4e5, ci95=[1.133e7, 1.267e7],
                        method="inversion")
    source.add_channel("tiny", tiny)
    source.add_channel("huge", huge)
    text = text_of(render(source.channels_json()), width=240)
    assert not re.search(r"\d[eE][+-]?\d", text), text
    assert "-0.0006788 ± 0.00001234 Pa (s.e.)" in row(text, "tiny")
    assert "[-0.000703, -0.0006546] Pa" in row(text, "tiny")
    assert "12,000,000 ± 340,000 (s.e.)" in row(text, "huge")  # no unit: nothing extra
    assert "[11,330,000, 12,670,000] inversion" in row(text, "huge")


def test_watch_help_documents_the_url():
    result = CliRunner().invoke(main, ["watch", "--help"])
    assert result.exit_code == 0, result.output
    assert "[URL]" in result.output
    assert "URL is the collector's HTTP address" in result.output
    assert "http://127.0.0.1:8080" in result.output  # the default
    assert "/api/channels" in result.output
    assert "standard error" in result.output


def test_render_a_circular_channel_without_a_direction_or_std(source):
    """Near-uniform angles: "any direction"; a resultant length estimate above 1 (noise on
    a channel that barely moves): no circular std, rather than 0."""
    document = source.channels_json()
    roll = document["channels"]["roll"]
    roll["direction"] = {"stderr": 2.0, "half_width": None, "ci95": None,
                         "reason": "any direction: ..."}
    roll["resultant_length"].update(estimate=1.003, ci95=[0.99, 1.0])
    roll.update(circular_std=None, circular_std_reason="the resultant length estimate is 1...")
    line = row(text_of(render(document)), "roll")
    assert f"μ {fmt(roll['circular_mean'])} rad (" in line and "any direction" in line
    assert "R 1.003 [0.99, 1]" in line and "σ – (R ≥ 1)" in line


def test_render_is_pure(source):
    document = source.channels_json()
    snapshot = copy.deepcopy(document)
    first = text_of(render(document))
    assert text_of(render(document)) == first
    assert document == snapshot


def test_render_null_statistics_and_odd_input(source):
    source.add_channel("humidity")
    source.add_channel("[bold]odd[/bold]", {"kind": "spherical", "count": None})
    text = text_of(render(source.channels_json()))
    assert "– ± –" in row(text, "humidity")
    assert "[–, –]" in row(text, "humidity")
    assert "[bold]odd[/bold]" in text  # shown as it is, not as rich markup
    assert "kind 'spherical' not shown" in text
    assert "waiting for the collector" in text_of(render(None))
    assert text_of(render({"channels": "garbage"}))  # no exception


def test_render_flags_a_disconnected_broker(source):
    source.broker_connected = False
    source.step()
    assert "broker DISCONNECTED" in text_of(render(source.channels_json()))
    document = source.channels_json()
    del document["broker"]  # an older collector: no broker field, nothing said about it
    assert "broker" not in text_of(render(document))


def test_render_shows_the_error(source):
    text = text_of(render(source.channels_json(), error="cannot reach x: refused"))
    assert "⚠ cannot reach x: refused" in text
    assert "accel_x" in text  # the last data stays visible


# -- watch ---------------------------------------------------------------------------------

def test_watch_once_against_a_server(server, source):
    console = Console(record=True, width=200, file=io.StringIO())
    assert watch(server.url, once=True, console=console) == 0
    text = console.export_text()
    for name in ("accel_x", "roll", "accel_polar", "accel"):
        assert row(text, name)
    assert f"{source.channels_json()['channels']['roll']['count']:,}" in row(text, "roll")


def test_watch_once_unreachable_shows_the_error():
    console = Console(record=True, width=200, file=io.StringIO())
    url = f"http://127.0.0.1:{free_port()}"
    assert watch(url, once=True, console=console) == 1
    assert f"cannot reach {url}/api/channels" in console.export_text()


@pytest.mark.parametrize("url", ["http://[bad", "ftp://127.0.0.1:1", "http://127.0.0.1:notaport"])
def test_watch_once_bad_urls_do_not_raise(url):
    console = Console(record=True, width=200, file=io.StringIO())
    assert watch(url, once=True, console=console, interval=0.5) == 1
    assert "⚠" in console.export_text()


def test_watch_once_http_error_shows_the_servers_message():
    class Broken:
        def capture(self):
            raise RuntimeError("engine down")

    web = WebServer(Broken(), host="127.0.0.1", port=0).start()
    try:
        console = Console(record=True, width=200, file=io.StringIO())
        assert watch(web.url, once=True, console=console) == 1
        assert "HTTP 503 the aggregates could not be computed" in console.export_text()
    finally:
        web.stop()


def test_watch_live_retries_through_errors(server, source, monkeypatch):
    """Live mode: an error is displayed, the next poll recovers; Ctrl-C ends it."""
    answers = iter([(None, "cannot reach the collector: refused")])
    real_fetch = watch_module.fetch

    def fetch(url, *, timeout):
        return next(answers, None) or real_fetch(url, timeout=timeout)

    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(watch_module, "fetch", fetch)
    monkeypatch.setattr(watch_module, "time", SimpleNamespace(sleep=sleep))
    console = Console(record=True, width=200, file=io.StringIO(), force_terminal=True)
    assert watch(server.url, interval=0.5, console=console) == 0
    text = console.export_text()
    assert "cannot reach the collector: refused (retrying every 0.5 s)" in text
    assert "accel_polar" in text
    assert sleeps == [0.5, 0.5, 0.5]


def test_render_shows_each_category_with_its_share_and_interval(source):
    frequencies = {"labels": ["rest", "[bold]walk[/bold]", "run"], "raw": [0.5, 0.3, 0.2],
                   "estimate": [0.61, 0.3, 0.09], "stderr": [0.02, 0.02, 0.02],
                   "ci95": [[0.57, 0.65], [0.26, 0.34], [0.05, 0.13]],
                   "shares": [0.6123, 0.3, 0.0877]}
    source.add_channel("activity", {
        "kind": "categorical", "count": 1500, "agents": 4, "frequencies": frequencies,
        "mechanism": {"name": "olh", "epsilon": 1.5, "categories": 3, "delta": 0.0}})
    source.add_channel("posture", {
        "kind": "categorical", "count": 0, "agents": 0,
        "mechanism": {"name": "grr", "epsilon": 1.0, "categories": 2},
        "frequencies": {"labels": ["0", "1"], "raw": [None, None], "estimate": [None, None],
                        "stderr": [None, None], "ci95": [None, None],
                        "shares": [None, None]}})
    text = text_of(render(source.channels_json()))
    head = row(text, "activity")
    for cell in ("categorical", "1,500", "olh over 3 categories", "1.5"):
        assert cell in head, cell
    assert "0.6123" in row(text, "rest") and "[0.57, 0.65]" in row(text, "rest")
    assert "0.0877" in row(text, "run") and "[0.05, 0.13]" in row(text, "run")
    assert "[bold]walk[/bold]" in text  # a label is shown as it is, not as markup
    assert "– " in row(text, "0") and "[–, –]" in row(text, "1")
