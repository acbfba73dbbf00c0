"""How long a built packet may be served: never past the expiry of anything it shows."""

from __future__ import annotations

from datetime import datetime

from memsvc.prefetch.model import Packet
from memsvc.v1 import memory_pb2 as pb


def max_ttl_ms(packet: Packet, now: datetime) -> int | None:
    """Milliseconds until the first fact or episode the packet shows expires (None: nothing
    it shows expires; <= 0: already expired, do not cache)."""
    expiries = [r.expires_at for r in packet.facts if r.expires_at is not None]
    expiries += [e.expires_at for e in packet.episodes if e.expires_at is not None]
    if not expiries:
        return None
    return int((min(expiries) - now).total_seconds() * 1000)


def holds_expired(wire: pb.PrefetchResponse, now: datetime) -> bool:
    """Whether a cached packet shows a fact expired by now (belt and braces: the cache entry
    itself lives no longer than its first expiry)."""
    now_s = now.timestamp()
    return any(
        f.HasField("expires_at") and f.expires_at.seconds + f.expires_at.nanos / 1e9 <= now_s
        for f in wire.facts
    )
