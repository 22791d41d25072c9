"""Scale-out on NATS JetStream (docs/guides/SCALE_OUT.md).

Devices keep speaking MQTT.  An *ingress* (the collector's network process with a
JetStream journal) appends every message to a replicated stream, on a subject that
carries a partition computed from the agent id, and acknowledges it to MQTT only
once JetStream has stored it.  *Members* each own a set of partitions at a time
(leases in a KV bucket), read them from their checkpointed stream sequence and
deduplicate exactly as a single collector does; partition state lives in a KV
bucket, written with compare-and-set so a stale owner's write fails.  The *merge
view* reads the partition states and serves the dashboard and API.
"""
