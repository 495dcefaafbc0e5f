"""The shared prefix index's parts, without Redis: the message format (round trip, every malformed
form refused), the pending batch (a key once, at its last touch; bounded), and what applying another
replica's message does to this one's index (backends by URL, its own and malformed ones skipped,
a flood cut off)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry

from sagegate.gateway.backends import BackendPool
from sagegate.gateway.locality import Locality
from sagegate.gateway.settings import GatewaySettings
from sagegate.gateway.settings_share import ShareSettings
from sagegate.gateway.shared_prefixes import SharedPrefixes, shared_prefixes
from sagegate.gateway.shared_prefixes_parts import Batching, Malformed, decode, encode, sender

URLS = ["http://x:8000", "http://y:8000"]
OTHER = b"otherrep"


def replica(urls: list[str] = URLS, **share: float) -> SharedPrefixes:
    """A replica's shared index over ``urls`` (healthy backends), not started (no Redis)."""
    settings = GatewaySettings.model_validate({"backends": urls})
    pool = BackendPool(settings, httpx.AsyncClient())
    for b in pool.backends:
        b.load.healthy = True
    loc = Locality(settings.placement, pool.backends)
    registry = CollectorRegistry()
    return SharedPrefixes(ShareSettings(**share), "redis://unused", "k", loc, pool.backends, registry)


def sample(sp: SharedPrefixes, name: str, **labels: str) -> float:
    return float(sp.stats.registry.get_sample_value(name, labels) or 0.0)


def test_a_message_round_trips() -> None:
    keys = [0, 1, 2**32 - 1, 123456789]
    data = encode(b"replica1", 64, [("http://x:8000", keys), ("http://ü:1", [])], [("s-1", 1, 2000)])
    assert len(data) < 100 and sender(data) == b"replica1"
    batch = decode(data)
    assert batch.replica == b"replica1" and batch.block_tokens == 64
    assert [(n, list(k)) for n, k in batch.touches] == [("http://x:8000", keys), ("http://ü:1", [])]
    assert batch.sessions == [("s-1", 1, 2000)]


def test_every_malformed_message_is_refused() -> None:
    data = encode(b"replica1", 64, [("http://x:8000", [1, 2, 3])], [("s", 0, 9)])
    for cut in range(len(data)):  # every truncation
        with pytest.raises(Malformed):
            decode(data[:cut])
    bad = [
        data + b"\0",  # trailing bytes
        b"XXXX" + data[4:],  # not this format
        data[:4] + b"\x09" + data[5:],  # another version
        encode(b"replica1", 64, [("http://x", [1])]).replace(b"http://x", b"http:/\xff\xfe"),  # not UTF-8
    ]
    for d in bad:
        with pytest.raises(Malformed):
            decode(d)
    broken = bytearray(data)
    broken[-7] = 7  # the session (backend:u8 tokens:u32 len:u8 "s") names backend 7 of 1
    with pytest.raises(Malformed):
        decode(bytes(broken))
    with pytest.raises(OverflowError):
        encode(b"replica1", 64, [("x", [2**32])])


def test_a_key_goes_once_at_its_last_touch_and_the_batch_is_bounded() -> None:
    sp = replica(max_pending_blocks=6)
    sp.touched(0, [1, 2, 3], "s-1", 300)
    sp.touched(0, [1, 2, 9], None, 0)  # 1 and 2 again: they move behind 3
    sp.touched(1, [5], None, 0)
    assert sp.batch.total == 5
    touches, sessions = sp.batch.take(4)
    assert touches == [(0, [3, 1, 2, 9])] and sessions == [("s-1", 0, 300)]  # at most 4 keys a message
    assert sp.batch.take(4) == ([(1, [5])], []) and not sp.batch
    sp.touched(0, list(range(100, 110)), None, 0)  # past the bound: the oldest go, counted
    assert sp.batch.total == 6 and list(sp.batch.keys[0]) == list(range(104, 110))
    assert sample(sp, "sagegate_prefix_share_dropped_blocks_total", reason="overflow") == 4


def test_a_failed_publish_puts_its_batch_back_before_newer_touches() -> None:
    sp = replica()
    sp.touched(0, [1, 2, 3], "s-1", 300)
    touches, sessions = sp.batch.take(100)
    sp.touched(0, [3, 4], None, 0)  # touched while the publish was failing
    assert sp.batch.put_back(touches, sessions) == 0
    assert list(sp.batch.keys[0]) == [1, 2, 3, 4] and sp.batch.total == 4
    assert list(sp.batch.sessions) == ["s-1"]


def test_another_replicas_message_touches_the_same_backend_by_url() -> None:
    sp = replica(list(reversed(URLS)))  # this replica lists the fleet the other way round
    sp.locality.sessions.maxsize = 1
    data = encode(OTHER, 64, [("http://x:8000", [7, 8]), ("http://z:9", [1, 2, 3])], [("s", 0, 4000)])
    sp.apply(data)
    x, y = sp.backends[1], sp.backends[0]
    assert x.prefix.match([7, 8]) == 2 and len(y.prefix) == 0
    assert list(sp.locality.sessions) == ["s"] and sp.locality.sessions.peek("s") == (1, 4000)
    assert sample(sp, "sagegate_prefix_share_dropped_blocks_total", reason="unknown_backend") == 3
    sp.apply(encode(OTHER, 64, [("http://y:8000", [5])], [("t", 0, 10)]))
    assert list(sp.locality.sessions) == ["t"]  # bounded by placement.max_sessions
    assert sample(sp, "sagegate_prefix_share_blocks_total", what="applied") == 3


def test_own_malformed_foreign_block_size_and_down_backends_are_skipped() -> None:
    sp = replica()
    sp.apply(encode(sp.replica, 64, [("http://x:8000", [1])]))  # its own
    sp.apply(b"junk")
    sp.apply("not bytes")
    sp.apply(encode(OTHER, 64, [("http://x:8000", [1])])[:-1])
    sp.apply(encode(OTHER, 16, [("http://x:8000", [1])]))  # keyed with another block size
    sp.apply(b"SGPI" + bytes(2 << 20))
    sp.backends[1].load.healthy = False  # predicted empty: its own probes decide when it is back
    sp.apply(encode(OTHER, 64, [("http://y:8000", [1])]))
    assert all(len(b.prefix) == 0 for b in sp.backends)
    assert sample(sp, "sagegate_prefix_share_dropped_messages_total", reason="malformed") == 3
    assert sample(sp, "sagegate_prefix_share_dropped_messages_total", reason="block_size") == 1
    assert sample(sp, "sagegate_prefix_share_dropped_messages_total", reason="too_large") == 1
    assert sample(sp, "sagegate_prefix_share_dropped_blocks_total", reason="unhealthy_backend") == 1
    assert sample(sp, "sagegate_prefix_share_messages_total", what="applied") == 1


def test_a_flood_is_cut_off_at_the_apply_rate() -> None:
    now = [0.0]
    sp = replica(max_apply_blocks_per_s=1000)
    sp.clock = lambda: now[0]
    sp._bucket_at = 0.0
    msg = encode(OTHER, 64, [("http://x:8000", list(range(200)))])  # ~210 blocks' worth each
    for _ in range(10):
        sp.apply(msg)
    assert sample(sp, "sagegate_prefix_share_messages_total", what="applied") == 4
    assert sample(sp, "sagegate_prefix_share_dropped_messages_total", reason="rate") == 6
    now[0] = 1.0  # a second later the budget is back
    sp.apply(msg)
    assert sample(sp, "sagegate_prefix_share_messages_total", what="applied") == 5


def test_sharing_needs_redis_and_cache_aware_placement() -> None:
    def built(**kw: object) -> bool:
        s = GatewaySettings.model_validate({"backends": URLS, **kw})
        pool = BackendPool(s, httpx.AsyncClient())
        loc = Locality(s.placement, pool.backends) if s.placement.mode == "cache_aware" else None
        return shared_prefixes(s, loc, pool.backends, CollectorRegistry()) is not None

    assert built(redis_url="redis://r:6379")
    assert not built()
    assert not built(redis_url="redis://r:6379", placement={"mode": "least_loaded"})
    assert not built(redis_url="redis://r:6379", placement={"share": {"enabled": False}})


def test_a_message_names_at_most_255_backends() -> None:
    batch = Batching(300, 10**6)
    for i in range(300):
        batch.touch(i, [i], f"s-{i}", 1)
    touches, sessions = batch.take(10**6)
    assert len(touches) == 255 and len(sessions) == 255  # the others' sessions wait with their keys
    message = decode(encode(b"replica1", 64, [(str(i), k) for i, k in touches], sessions))
    assert message.sessions[-1] == ("s-254", 254, 1)
    touches, sessions = batch.take(10**6)
    assert len(touches) == len(sessions) == 45 and not batch
