"""The NATS side: connecting, and the stream and KV buckets every role relies on.

Every role (ingress, member, merge view) calls ``open_engine`` with the same
``[scale_out]`` table; the first to run creates the stream and the buckets, the
others check that what exists matches (a stream made with another partition
count would send agents to other partitions than the members expect).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass

import nats
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from collector.config import ConfigError, ScaleOutConfig
from collector.scaleout.state_objects import StateObjects

log = logging.getLogger(__name__)

PARTITIONS_KEY = "ldp_partitions"  # stream metadata: the partition count it was made with
MAX_STATE_BYTES = 8 << 20  # one partition's state (the servers' max_payload must allow it)
READY_TIMEOUT = 60.0
MIN_SERVER = (2, 11)  # batch direct get (ADR-31)
# A consumer create (the merge view's watch) takes milliseconds, or is never answered:
# while a node is down the server places some one-replica consumers on it (about one
# in three on a 3-node cluster, measured for over a minute after the kill).
CREATE_TIMEOUT = 2.0
IDLE_WRITES = 5  # a member writes an unchanged partition's state every this many checkpoints


def rewrite_seconds(config: ScaleOutConfig) -> float:
    """A live member writes each of its partitions' state at least this often."""
    return IDLE_WRITES * config.checkpoint_seconds


class EngineError(RuntimeError):
    """The cluster holds a stream or bucket that does not match the configuration."""


@dataclass
class Engine:
    nc: nats.NATS
    js: JetStreamContext
    config: ScaleOutConfig
    leases: KeyValue
    states: KeyValue
    state_objects: StateObjects  # states too large for a KV value (state_objects.py)

    @property
    def stream(self) -> str:
        return self.config.stream

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.drain()


def _password(config: ScaleOutConfig) -> str | None:
    if config.password_file is None:
        return None
    try:
        return config.password_file.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"scale_out.password_file: cannot be read ({exc})") from None


async def connect(config: ScaleOutConfig, name: str) -> nats.NATS:
    """A connection to any of the servers, reconnecting for ever (the client fails over
    between them)."""
    async def error(exc: Exception) -> None:
        log.debug("NATS: %s: %s", type(exc).__name__, exc)

    async def disconnected() -> None:
        log.warning("NATS: disconnected; reconnecting")

    async def reconnected() -> None:
        log.info("NATS: reconnected to %s", nc.connected_url.netloc if nc.connected_url
                 else "?")

    tls = None
    if config.tls_ca is not None:
        tls = ssl.create_default_context(cafile=str(config.tls_ca))
    nc = await nats.connect(config.servers, name=name, user=config.username,
                            password=_password(config), tls=tls, max_reconnect_attempts=-1,
                            reconnect_time_wait=0.5, connect_timeout=5,
                            error_cb=error, disconnected_cb=disconnected,
                            reconnected_cb=reconnected, allow_reconnect=True)
    return nc


def stream_config(config: ScaleOutConfig) -> StreamConfig:
    return StreamConfig(
        name=config.stream, subjects=[f"{config.stream}.*"], num_replicas=config.replicas,
        storage=StorageType.FILE, retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD, max_age=config.max_age_seconds,
        duplicate_window=config.duplicate_window_seconds, max_msg_size=1 << 20,
        allow_direct=True,  # members read with batch direct gets, which every replica serves
        metadata={PARTITIONS_KEY: str(config.partitions)},
        description="edge-ldp: every fleet message, by partition of its agent")


class _NotPlacedYet(Exception):
    """The cluster could not place a new stream: its peers have not all joined yet."""


# What a cluster answers while it elects a leader (after a start, or a node's death).
_NOT_YET = (NatsTimeoutError, NoRespondersError, ServiceUnavailableError, _NotPlacedYet)


async def _until_ready(step, deadline: float, what: str, not_yet=_NOT_YET):
    """``await step()``, again every half second while it raises ``not_yet`` (the
    cluster is not ready yet), until ``deadline`` (the loop's time)."""
    while True:
        try:
            return await step()
        except not_yet as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise EngineError(f"{what} is not available: {exc!r}") from None
            await asyncio.sleep(0.5)


async def _ensure_stream(js: JetStreamContext, config: ScaleOutConfig) -> None:
    try:
        info = await js.stream_info(config.stream)
    except NotFoundError:
        try:
            await js.add_stream(stream_config(config))
            log.info("created stream %s: %d partitions, %d replicas", config.stream,
                     config.partitions, config.replicas)
            return
        except BadRequestError as exc:  # another role created it meanwhile, or ...
            try:
                info = await js.stream_info(config.stream)
            except NotFoundError:  # ... a young cluster has too few peers to place it
                raise _NotPlacedYet(str(exc)) from None
    made_with = (info.config.metadata or {}).get(PARTITIONS_KEY)
    if made_with != str(config.partitions):
        raise EngineError(f"stream {config.stream} was created with {made_with} partitions, "
                          f"[scale_out] partitions says {config.partitions}: the count is "
                          f"fixed when the stream is created (docs/guides/SCALE_OUT.md)")
    if not info.config.allow_direct:  # made by a version whose members used consumers
        info.config.allow_direct = True
        await js.update_stream(info.config)
        log.info("stream %s: direct gets allowed (members read with them)", config.stream)


async def _bucket(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    try:
        return await js.key_value(config.bucket)
    except Exception:  # BucketNotFoundError
        try:
            return await js.create_key_value(config)
        except BadRequestError:
            return await js.key_value(config.bucket)


async def _object_store(js: JetStreamContext, config: ObjectStoreConfig) -> ObjectStore:
    try:
        return await js.object_store(config.bucket)
    except Exception:  # BucketNotFoundError
        try:
            return await js.create_object_store(config.bucket, config)
        except BadRequestError:
            return await js.object_store(config.bucket)


async def open_engine(config: ScaleOutConfig, name: str,
                      ready_timeout: float = READY_TIMEOUT) -> Engine:
    nc = await connect(config, name)
    js = nc.jetstream(timeout=10)
    try:
        version = nc.connected_server_version
        if (version.major, version.minor) < MIN_SERVER:
            raise EngineError(f"nats-server {version} is too old: members read with batch "
                              f"direct gets, which need {'.'.join(map(str, MIN_SERVER))} or "
                              f"later (docs/guides/SCALE_OUT.md)")
        # JetStream answers once the cluster has a meta leader, the stream once it has
        # its own (seconds after a start, or after the node that led it died).
        deadline = asyncio.get_running_loop().time() + ready_timeout
        await _until_ready(js.account_info, deadline, "JetStream", not_yet=Exception)
        await _until_ready(lambda: _ensure_stream(js, config), deadline,
                           f"stream {config.stream}")
        leases = await _bucket(js, KeyValueConfig(
            bucket=f"{config.stream}_leases", ttl=config.lease_seconds,
            replicas=config.replicas, history=1, storage=StorageType.FILE,
            description="edge-ldp: which member owns each partition (and live members)"))
        states = await _bucket(js, KeyValueConfig(
            bucket=f"{config.stream}_state", replicas=config.replicas, history=1,
            storage=StorageType.FILE, max_value_size=MAX_STATE_BYTES,
            description="edge-ldp: each partition's aggregates and stream position"))
        objects = await _object_store(js, ObjectStoreConfig(
            bucket=f"{config.stream}_state_objects", replicas=config.replicas,
            storage=StorageType.FILE,
            description="edge-ldp: partition states larger than [scale_out] "
                        "inline_state_bytes, named by their KV value"))
    except BaseException:
        await nc.close()
        raise
    return Engine(nc, js, config, leases, states,
                  StateObjects(objects, config.inline_state_bytes))
