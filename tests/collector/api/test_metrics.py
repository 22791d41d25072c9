"""/metrics: Prometheus text with every family of docs/reference/API.md."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from tests.support.web import (
    request,
)

# -- metrics --------------------------------------------------------------------------------------

def test_metrics_are_prometheus_text(server):
    status, headers, body = request(server, "GET", "/metrics")
    assert status == 200
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert headers["cache-control"] == "no-store"
    text = body.decode()
    for metric in ("ldp_ingest_messages_total", "ldp_ingest_values_total",
                   "ldp_ingest_duplicates_total", 'ldp_ingest_rejects_total{reason="schema"}',
                   "ldp_agents_online", 'ldp_channel_count{channel="accel_x"}',
                   'ldp_channel_mean_estimate{channel="accel_x"}',
                   'ldp_channel_mean_stderr{channel="accel_x"}',
                   'ldp_channel_resultant_length{channel="roll"}',
                   'ldp_channel_resultant_length_stderr{channel="roll"}',
                   'ldp_channel_circular_mean{channel="roll"}',
                   'ldp_channel_circular_mean_half_width{channel="roll"}'):
        assert re.search(rf"^{re.escape(metric)} \S+$", text, re.M), metric


def test_metrics_parse_and_have_every_family(server, source):
    text = request(server, "GET", "/metrics")[2].decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    # The parser names a counter family without its _total (the samples keep it).
    assert set(families) >= {
        "ldp_ingest_messages", "ldp_ingest_values", "ldp_ingest_duplicates",
        "ldp_ingest_rejects", "ldp_broker_connected", "ldp_agents_online",
        "ldp_channel_count", "ldp_channel_mean_estimate", "ldp_channel_mean_stderr",
        "ldp_channel_resultant_length", "ldp_channel_resultant_length_stderr",
        "ldp_channel_circular_mean", "ldp_channel_circular_mean_half_width",
        "ldp_http_connections", "ldp_http_event_streams",
        "ldp_http_refused", "ldp_snapshot_errors", "ldp_snapshot_age_seconds",
        "ldp_snapshot_seconds", "ldp_snapshot_lock_seconds"}
    document = source.channels_json()
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in families.values() for sample in family.samples}
    assert samples["ldp_ingest_messages_total", ()] == document["ingest"]["messages"]
    assert samples["ldp_ingest_rejects_total", (("reason", "bad_code"),)] == 2
    assert samples["ldp_channel_count", (("channel", "accel"),)] == 15501
    assert samples["ldp_broker_connected", ()] == 1
    assert samples["ldp_http_connections", ()] >= 1  # this request's
    assert samples["ldp_http_refused_total", (("reason", "header_timeout"),)] == 0
    assert samples["ldp_snapshot_seconds", ()] > 0
    assert families["ldp_ingest_messages"].type == "counter"
    assert families["ldp_channel_count"].type == "gauge"
