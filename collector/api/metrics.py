"""The collector's Prometheus metrics: the families of an /api/channels document (names in
docs/reference/API.md), built with prometheus_client's metric families."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

CHANNEL_GAUGES = {
    "ldp_channel_count": ("Values accepted per channel.", lambda c: c["count"]),
    "ldp_channel_mean_estimate": ("Estimated true mean (linear channels).",
                                  lambda c: (c.get("mean") or {}).get("estimate")),
    "ldp_channel_mean_stderr": ("Standard error of the mean estimate.",
                                lambda c: (c.get("mean") or {}).get("stderr")),
    "ldp_channel_resultant_length": ("Estimated mean resultant length (circular channels; "
                                     "bias-corrected, over rho, may exceed 1 by noise).",
                                     lambda c: (c.get("resultant_length") or {}).get("estimate")),
    "ldp_channel_resultant_length_stderr": (
        "Standard error of the mean resultant length estimate (circular channels).",
        lambda c: (c.get("resultant_length") or {}).get("stderr")),
    "ldp_channel_circular_mean": ("Mean direction (circular channels), in the channel's unit.",
                                  lambda c: c.get("circular_mean")),
    "ldp_channel_circular_mean_half_width": (
        "Half-width of the mean direction's 95% interval (circular channels; absent where "
        "the reports give no direction).",
        lambda c: (c.get("direction") or {}).get("half_width")),
    # A polar channel's two components: the radius as a linear channel, the angle as a
    # circular one.
    "ldp_channel_radius_mean_estimate": (
        "Estimated true mean of the radius (polar channels).",
        lambda c: ((c.get("radius") or {}).get("mean") or {}).get("estimate")),
    "ldp_channel_radius_mean_stderr": (
        "Standard error of the radius mean estimate (polar channels).",
        lambda c: ((c.get("radius") or {}).get("mean") or {}).get("stderr")),
    "ldp_channel_angle_circular_mean": (
        "Mean direction of the angle (polar channels), in its unit.",
        lambda c: (c.get("angle") or {}).get("circular_mean")),
    "ldp_channel_angle_circular_mean_half_width": (
        "Half-width of the angle's mean direction 95% interval (polar channels).",
        lambda c: ((c.get("angle") or {}).get("direction") or {}).get("half_width")),
    "ldp_channel_angle_resultant_length": (
        "Estimated mean resultant length of the angle (polar channels).",
        lambda c: ((c.get("angle") or {}).get("resultant_length") or {}).get("estimate")),
    "ldp_channel_fleet_mean_estimate": (
        "Estimated mean of all wearers over the channel's series (linear channels whose "
        "wearers report under guarantees of their own; API.md fleet_mean).",
        lambda c: ((c.get("fleet_mean") or {}).get("mean") or {}).get("estimate")),
    "ldp_channel_fleet_mean_stderr": (
        "Standard error of the mean of all wearers.",
        lambda c: ((c.get("fleet_mean") or {}).get("mean") or {}).get("stderr")),
}
# A vector channel's axes: (help, the key in the axis's "mean").
AXIS_GAUGES = {
    "ldp_channel_axis_mean_estimate": ("Estimated true mean of each axis (vector channels).",
                                       "estimate"),
    "ldp_channel_axis_mean_stderr": ("Standard error of each axis's mean estimate.", "stderr"),
}


def document_metrics(document: dict) -> list[Metric]:
    """The metric families of an /api/channels document (names in docs/reference/API.md).

    A counter family is named with its ``_total``: prometheus_client takes the
    suffix off the family and puts it back on the sample and its HELP/TYPE."""
    ingest = document["ingest"]
    families: list[Metric] = [
        CounterMetricFamily("ldp_ingest_messages_total", "Report messages accepted.",
                            value=ingest["messages"]),
        CounterMetricFamily("ldp_ingest_values_total", "Perturbed values accepted.",
                            value=ingest["values"]),
        CounterMetricFamily("ldp_ingest_duplicates_total",
                            "Redelivered or replayed messages ignored.",
                            value=ingest["duplicates"]),
        _labelled(CounterMetricFamily, "ldp_ingest_rejects_total",
                  "Messages rejected, by reason.", "reason", ingest["rejects"]),
    ]
    families.append(_labelled(CounterMetricFamily, "ldp_range_results_ignored_total",
                              "Range results not shown, by reason.", "reason",
                              document.get("range_ignored", {})))
    connected = document["broker"]["connected"]
    if connected is not None:
        families.append(GaugeMetricFamily("ldp_broker_connected",
                                          "1 while the collector holds its subscription.",
                                          value=int(connected)))
    families.append(GaugeMetricFamily("ldp_agents_online", "Agents online.",
                                      value=document["agents_online"]))
    if "partitions" in document:  # the merge view
        families += [
            _labelled(GaugeMetricFamily, "ldp_partition_state_age_seconds",
                      "Age of each partition's latest state.", "partition",
                      {name: partition["age"]
                       for name, partition in document["partitions"].items()}),
            _labelled(CounterMetricFamily, "ldp_partition_state_rejects_total",
                      "Partition states rejected, by reason.", "reason",
                      document["partition_rejects"]),
        ]
    for metric, (help_text, extract) in CHANNEL_GAUGES.items():
        families.append(_labelled(GaugeMetricFamily, metric, help_text, "channel",
                                  {name: extract(channel)
                                   for name, channel in document["channels"].items()}))
    families += category_metrics(document["channels"])
    families += axis_metrics(document["channels"])
    families.append(info_metric(document["channels"]))
    return families


def info_metric(channels: dict) -> Metric:
    """``ldp_channel_info{channel,kind,unit,angle_unit} 1``: what each channel's values
    are measured in, to join on (label values: bounded names and units from reports)."""
    family = GaugeMetricFamily("ldp_channel_info", "Each channel's kind and units (always 1).",
                               labels=["channel", "kind", "unit", "angle_unit"])
    for name, channel in sorted(channels.items()):
        family.add_metric([name, channel["kind"], channel.get("unit") or "",
                           channel.get("angle_unit") or ""], 1)
    return family


def axis_metrics(channels: dict) -> list[Metric]:
    families = []
    for metric, (help_text, key) in AXIS_GAUGES.items():
        family = GaugeMetricFamily(metric, help_text, labels=["channel", "axis"])
        for name, channel in sorted(channels.items()):
            for axis, view in sorted((channel.get("axes") or {}).items()):
                value = (view.get("mean") or {}).get(key)
                if value is not None:
                    family.add_metric([name, axis], value)
        families.append(family)
    return families


# Per category of a categorical channel: (help, the key in its "frequencies").
CATEGORY_GAUGES = {
    "ldp_channel_category_share": ("Consistent share of each category (non-negative, "
                                   "summing to 1).", "shares"),
    "ldp_channel_category_estimate": ("Unbiased estimate of each category's share.",
                                      "estimate"),
    "ldp_channel_category_stderr": ("Standard error of the unbiased share.", "stderr"),
}
# A channel with more categories is left out of /metrics (one series per category).
METRIC_CATEGORIES_MAX = 64


def category_metrics(channels: dict) -> list[Metric]:
    families = []
    for metric, (help_text, key) in CATEGORY_GAUGES.items():
        family = GaugeMetricFamily(metric, help_text, labels=["channel", "category"])
        for name, channel in sorted(channels.items()):
            frequencies = channel.get("frequencies")
            if not frequencies or len(frequencies["labels"]) > METRIC_CATEGORIES_MAX:
                continue
            for label, value in zip(frequencies["labels"], frequencies[key]):
                if value is not None:
                    family.add_metric([name, label], value)
        families.append(family)
    return families


def _labelled(family_type, name: str, help_text: str, label: str, values: dict) -> Metric:
    """A family with one sample per label value (sorted), leaving out None values."""
    family = family_type(name, help_text, labels=[label])
    for key, value in sorted(values.items()):
        if value is not None:
            family.add_metric([key], value)
    return family
