"""Bad input, fuzzed: every request message of the service, built generically from its
descriptor, and raw bytes that are not valid protobuf, against the live server.

Whatever arrives, the answer is a well-defined status (never UNKNOWN, INTERNAL or, but for a
stream's own short final_deadline_ms, DEADLINE_EXCEEDED), and a call that is refused writes
nothing: before every call the test takes a fingerprint (row count and the xmin/ctid of
every row) of the fuzz tenant in every table that has a ``tenant_id`` column
(``erasure.USER_TABLES`` and more, ``api_keys`` included, by content without its background
``last_used_at`` stamp) and compares it after every non-OK answer. A row locked and released
is unchanged; a row inserted, updated or deleted is not.

Hypothesis and asyncio: the tests are ``async def`` under ``@given``; pytest-asyncio 1.x
recognises a Hypothesis test whose inner test is a coroutine function and runs each example
on the session event loop, the loop the server, pool and channel fixtures live on, so
examples await the real server and failures shrink normally. The fuzz tenant is seeded once
per module; ``database=None`` keeps Hypothesis from writing an example database into the
repository.
"""

from __future__ import annotations

import base64
import functools
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
import pytest
from google.protobuf import descriptor, message_factory
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from memsvc.config import Settings
from memsvc.server.app import MemsvcServer
from memsvc.storage import api_keys
from memsvc.storage.erasure import USER_TABLES
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc
from tests.conftest import Caller, _KeyedStub
from tests.ingest_helpers import msg

SERVICE = pb.DESCRIPTOR.services_by_name["MemoryService"]
METHODS = [m.name for m in SERVICE.methods]
# Generous: a slow answer to bad input is a finding, a slow shared CI box is not.
CALL_TIMEOUT_S = 30.0
# Fuzzed requests stay under the request size limit the test server runs with (4 MB),
# leaving room for the framing around the fuzzed values.
MAX_FUZZ_BYTES = Settings().max_request_bytes - 64 * 1024

C = grpc.StatusCode
ANY_METHOD = {C.OK, C.INVALID_ARGUMENT, C.UNAUTHENTICATED, C.RESOURCE_EXHAUSTED}
# Statuses only some RPCs have a reason to answer with (see memory.proto).
PER_METHOD = {
    "Correct": {C.NOT_FOUND, C.FAILED_PRECONDITION},
    "Forget": {C.NOT_FOUND},
    "GetMemoryHistory": {C.NOT_FOUND},
    "GetIngestStatus": {C.NOT_FOUND},
    # An idempotency key this user already used for a different request.
    "Ingest": {C.ALREADY_EXISTS},
    # A session this scope never had (or one already forgotten).
    "ForgetSession": {C.NOT_FOUND},
    # A stale expected_revision, or an APPEND past the block's limit.
    "UpdateCoreBlock": {C.FAILED_PRECONDITION},
    "UpdateMemory": {C.NOT_FOUND, C.FAILED_PRECONDITION},
    "GetMemory": {C.NOT_FOUND},
    # A position older than the retained changes.
    "WatchMemories": {C.OUT_OF_RANGE},
    # A final_deadline_ms the stream may ask (50 ms and up) but that even a degraded answer
    # does not fit on this machine now: the read gate says so instead of answering late.
    "RecallStream": {C.DEADLINE_EXCEEDED},
}

FUZZ_SETTINGS = hypothesis_settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


def request_class(method: str) -> type[Message]:
    return message_factory.GetMessageClass(SERVICE.methods_by_name[method].input_type)


def response_class(method: str) -> type[Message]:
    return message_factory.GetMessageClass(SERVICE.methods_by_name[method].output_type)


def method_path(method: str) -> str:
    return f"/{SERVICE.full_name}/{method}"


# -- the fuzz tenant -------------------------------------------------------------------------


@dataclass(repr=False)
class FuzzTenant:
    caller: Caller
    revoked_key: str
    fingerprint_sql: str
    ingest_ids: list[str]
    # Every memory id ever seeded (some are deleted or superseded by now).
    memory_ids: list[str]
    # Writes what earlier reads left for the background (last_referenced_at), so a
    # fingerprint taken after it only changes by what the next call does.
    settle: Callable[[], Awaitable[object]]

    def __repr__(self) -> str:
        return f"FuzzTenant({self.caller.tenant_id})"


SEEDS = [
    (pb.Scope(user_id="alice"), "I live in Lisbon"),
    (pb.Scope(user_id="alice", persona_id="nova"), "Nova likes jazz"),
    (pb.Scope(user_id="alice", agent_id="bot-1"), "Asked about taxes"),
    (pb.Scope(user_id="alice"), "I am allergic to peanuts"),
]


async def fingerprint_sql(conn: asyncpg.Connection) -> str:
    """One statement: (table, rows, hash of every row version) for each tenant-keyed table."""
    tables = [
        r["table_name"]
        for r in await conn.fetch(
            "SELECT DISTINCT table_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND column_name = 'tenant_id'"
            " ORDER BY table_name"
        )
    ]
    assert set(USER_TABLES) | {"api_keys"} <= set(tables), tables
    return " UNION ALL ".join(
        f"SELECT '{t}' AS tbl, count(*) AS n, coalesce(md5(string_agg({_row_version(t)},"
        f" ',' ORDER BY {_row_version(t)})), '') AS h FROM {t} r WHERE tenant_id = $1"
        for t in tables
    )


def _row_version(table: str) -> str:
    """What identifies a row's version: its xmin and ctid; for api_keys its content without
    last_used_at, which the server stamps for any key in use, in the background (once a
    minute per process), whatever the call answered."""
    if table == "api_keys":
        return "(to_jsonb(r) - 'last_used_at')::text"
    return "r.xmin::text || r.ctid::text"


@pytest.fixture(scope="module")
async def fuzz(pool: asyncpg.Pool, channel: grpc.aio.Channel, server: MemsvcServer) -> FuzzTenant:
    """The module's tenant: its key, a revoked second key, and an ingest."""
    tenant = f"t-fuzz-{uuid.uuid4().hex[:10]}"
    async with pool.acquire() as conn:
        key = await api_keys.create_key(conn, tenant, "fuzz")
        revoked = await api_keys.create_key(conn, tenant, "fuzz-revoked")
        await api_keys.revoke_key(conn, revoked)
        sql = await fingerprint_sql(conn)
    stub: Any = _KeyedStub(memory_pb2_grpc.MemoryServiceStub(channel), key)
    ingest = await stub.Ingest(
        pb.IngestRequest(
            scope=pb.Scope(user_id="alice"),
            session_id="s1",
            idempotency_key="fuzz-seed",
            messages=[msg("alice", "I am a vegetarian", message_id="m1")],
        )
    )
    return FuzzTenant(
        Caller(tenant, key, stub),
        revoked,
        sql,
        [ingest.ingest_id],
        [],
        settle=server.runtime.references.flush,
    )


@pytest.fixture
async def known(fuzz: FuzzTenant, pool: asyncpg.Pool) -> Known:
    """Before each test function: the seed memories exist again (earlier examples may have
    forgotten or corrected them), one of them freshly superseded, so fuzzed ids and tokens
    can name things that exist in every state."""
    stub = fuzz.caller.stub
    ids = []
    for sc, text in SEEDS:
        ids.append(
            (await stub.Remember(pb.RememberRequest(scope=sc, content=text))).memory.memory_id
        )
    corrected = await stub.Correct(
        pb.CorrectRequest(scope=SEEDS[0][0], memory_id=ids[0], new_content=f"Porto {uuid.uuid4()}")
    )
    fuzz.memory_ids.extend([*ids, corrected.memory_id])
    listed = await stub.ListMemories(pb.ListMemoriesRequest(scope=SEEDS[0][0], page_size=1))
    async with pool.acquire() as conn:
        vector = await conn.fetchval(
            "SELECT embedding FROM memories WHERE tenant_id = $1 AND memory_id = $2",
            fuzz.caller.tenant_id,
            uuid.UUID(ids[1]),
        )
    return Known(
        memory_ids=tuple(dict.fromkeys(fuzz.memory_ids)),
        ingest_ids=tuple(fuzz.ingest_ids),
        page_tokens=(listed.next_page_token,),
        vector=tuple(float(v) for v in vector.to_list()),
    )


async def fingerprint(pool: asyncpg.Pool, fuzz: FuzzTenant) -> dict[str, tuple[int, str]]:
    async with pool.acquire() as conn:
        rows = await conn.fetch(fuzz.fingerprint_sql, fuzz.caller.tenant_id)
    return {r["tbl"]: (r["n"], r["h"]) for r in rows}


# -- values ----------------------------------------------------------------------------------

# Every script and the characters validators and PostgreSQL care about.
SPECIMENS = [
    "alice",
    "Ünïcödé",
    "我住在新加坡",
    "私はベジタリアンです",
    "한국어 문장입니다",
    "Я живу в Москве",
    "أنا نباتي",
    "עברית",
    "हिन्दी",
    "ไทย",
    "ᚠᛇᚻ",
    "𓀀𓀁",
    "🙂👨‍👩‍👧",
    "e\u0301\u0301\u0301",
    "\u202eevil",
    "\ufeffbom",
    "zero\u200bwidth",
    "\u2028line\u2029",
    "tab\tnew\nline\r",
    "\x00",
    "nul\x00in",
    "\x07bell",
    "\x1b[31m",
    "\x7f",
    "\u0085",
    "\ud7ff\ue000\U0010ffff",
    "'; DROP TABLE memories; --",
    "%_\\",
    "' & '",
    "a:* & !b | (c <-> d)",
    "!!!",
    "NaN",
    "-1",
    "",
    " ",
    "   padded  ",
]
LONG_SIZES = [128, 129, 200, 201, 300, 301, 500, 501, 2_000, 2_001, 8_000, 8_001, 40_000, 900_000]
COUNTS = [2, 20, 21, 100, 101, 200, 201, 1_000, 1_001]
ID_FIELDS = {"user_id", "persona_id", "agent_id", "sender_id", "session_id", "message_id"}


def long_tokens() -> st.SearchStrategy[str]:
    """One character repeated, or a few words repeated: past every limit, under 4 MB."""
    unit = st.one_of(st.characters(codec="utf-8"), st.sampled_from(["ab ", "咖啡", "x"]))
    return st.builds(lambda u, n: u * n, unit, st.sampled_from(LONG_SIZES))


def uuids(known: Sequence[str]) -> st.SearchStrategy[str]:
    fresh = st.uuids().map(str)
    return st.one_of(
        st.sampled_from(list(known)),
        fresh,
        st.sampled_from(list(known)).map(str.upper),
        st.sampled_from(list(known)).map(lambda u: "{" + u + "}"),
        st.sampled_from(list(known)).map(lambda u: "urn:uuid:" + u),
        st.sampled_from(list(known)).map(lambda u: u.replace("-", "")),
        fresh.map(lambda u: u[:-1]),
    )


def page_tokens(known: Sequence[str]) -> st.SearchStrategy[str]:
    """Tokens that decode: real ones, and base64 JSON of anything, odd dates included."""
    dates = st.one_of(
        st.sampled_from(
            [
                "0001-01-01T00:00:00+14:00",
                "9999-12-31T23:59:59-14:00",
                "2026-01-01T00:00:00",
                "2026-01-01",
                "2026-13-45T99:99:99",
                "",
            ]
        ),
        st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
        st.text(max_size=30),
    )
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=5,
    )
    pairs = st.one_of(
        st.tuples(dates, uuids([str(uuid.UUID(int=0))])).map(list),
        st.lists(st.one_of(dates, json_values), max_size=3),
        json_values,
    )
    encoded = pairs.map(lambda v: base64.urlsafe_b64encode(json.dumps(v).encode()).decode("ascii"))
    return st.one_of(st.sampled_from(list(known)), encoded, encoded.map(lambda t: t + "="))


@dataclass(frozen=True)
class Known:
    """Values of the seeded tenant that fuzzed fields may name."""

    memory_ids: tuple[str, ...]
    ingest_ids: tuple[str, ...]
    page_tokens: tuple[str, ...]
    vector: tuple[float, ...]

    def __repr__(self) -> str:
        # Short, for Hypothesis's report of a failing example.
        return f"Known({len(self.memory_ids)} memory ids, {len(self.ingest_ids)} ingest ids)"


def strings(field: descriptor.FieldDescriptor, known: Known) -> st.SearchStrategy[str]:
    general = st.one_of(
        st.text(st.characters(codec="utf-8"), max_size=40),
        st.text(st.characters(categories=["Cc", "Cf", "Zs", "Zl", "Zp", "Mn"]), max_size=10),
        st.sampled_from(SPECIMENS),
        long_tokens(),
    )
    name = field.name
    if name in ("memory_id", "memory_ids", "supersedes_id"):
        return st.one_of(uuids(known.memory_ids), general)
    if name == "ingest_id":
        return st.one_of(uuids(known.ingest_ids), general)
    if name == "page_token":
        return st.one_of(page_tokens(known.page_tokens), general)
    if name in ("category", "categories"):
        return st.one_of(st.sampled_from(["preference", "PROFILE", " goal ", "event"]), general)
    if name in ("role", "roles"):
        return st.one_of(st.sampled_from(["core", "Context", " detail", "temporal"]), general)
    if name in ID_FIELDS:
        return st.one_of(st.sampled_from(["alice", "nova", "bot-1", "s1", "m1"]), general)
    return general


def floats() -> st.SearchStrategy[float]:
    return st.one_of(
        st.sampled_from([0.0, -0.0, 1.0, 0.5, -1.0, 1.5, 1e-45, 3.4e38, -3.4e38]),
        st.floats(width=32, allow_nan=True, allow_infinity=True),
    )


def vectors(known: Known, dim: int) -> st.SearchStrategy[list[float]]:
    """query_vector: short, long, or exactly the dimension with odd values."""
    tiled = st.builds(
        lambda vals, n: [vals[i % len(vals)] for i in range(n)],
        st.lists(floats(), min_size=1, max_size=4),
        st.sampled_from([dim - 1, dim, dim, dim + 1]),
    )
    real = st.just(list(known.vector))
    poked = st.builds(
        lambda v, i, x: [*v[:i], x, *v[i + 1 :]],
        real,
        st.integers(0, dim - 1),
        floats(),
    )
    return st.one_of(st.lists(floats(), max_size=5), tiled, real, poked)


def scalar(field: descriptor.FieldDescriptor, known: Known) -> st.SearchStrategy[Any]:
    t = field.type
    F = descriptor.FieldDescriptor
    if t == F.TYPE_STRING:
        return strings(field, known)
    if t == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return floats()
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        edges = [0, 1, -1, 100, 101, 500, 501, 599, 600, 32_000, 32_001, 2**31 - 1, -(2**31)]
        return st.one_of(st.sampled_from(edges), st.integers(-(2**31), 2**31 - 1))
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        edges = [0, 1, -1, 253402300800, -62135596801, 2**63 - 1, -(2**63)]
        return st.one_of(st.sampled_from(edges), st.integers(-(2**63), 2**63 - 1))
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t == F.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(numbers), st.integers(-(2**31), 2**31 - 1))
    raise AssertionError(f"no strategy for field type {t} of {field.full_name}")


def encoded_size(value: Any) -> int:
    if isinstance(value, Message):
        return value.ByteSize()
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    return 16


def repeat_within_limit(value: Any, count: int) -> list[Any]:
    """``count`` copies of ``value``, fewer if that would not fit in one request."""
    fits = max(1, MAX_FUZZ_BYTES // (encoded_size(value) + 8))
    return [value] * min(count, fits)


def field_values(
    field: descriptor.FieldDescriptor, known: Known, dim: int, depth: int
) -> st.SearchStrategy[Any]:
    if field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
        one = messages(field.message_type, known, dim, depth + 1)
    else:
        one = scalar(field, known)
    if not field.is_repeated:
        return one
    if field.name == "query_vector":
        return vectors(known, dim)
    return st.one_of(
        st.lists(one, max_size=4),
        st.builds(repeat_within_limit, one, st.sampled_from(COUNTS)),
    )


def assign(message: Message, field: descriptor.FieldDescriptor, value: Any) -> None:
    if field.is_repeated:
        getattr(message, field.name).extend(value)
    elif field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


def build(cls: type[Message], values: dict[str, Any]) -> Message:
    message = cls()
    for name, value in values.items():
        assign(message, cls.DESCRIPTOR.fields_by_name[name], value)
    return message


def messages(
    desc: descriptor.Descriptor, known: Known, dim: int, depth: int = 0
) -> st.SearchStrategy[Message]:
    """Any message of this type: each field set or not, to any value of its type."""
    cls = message_factory.GetMessageClass(desc)
    if depth > 4:
        return st.just(cls())
    optional = {f.name: field_values(f, known, dim, depth) for f in desc.fields}
    return st.fixed_dictionaries({}, optional=optional).map(lambda v: build(cls, v))


def fits(request: Message) -> bool:
    return request.ByteSize() <= MAX_FUZZ_BYTES


# -- valid requests, mutated -----------------------------------------------------------------

ALICE = pb.Scope(user_id="alice")
SENT_AT = Timestamp(seconds=1_790_000_000)


# One line of an export each (ImportMemories takes one line per stream message).
IMPORT_SUMMARY_LINE = '{"type":"summary","counts":{}}'
IMPORT_MEMORY_LINE = (
    '{"type":"memory","memory_id":"0b6c5d1e-8f4a-4f7e-9a51-3c2d1e0f9a8b",'
    '"lineage_id":"0b6c5d1e-8f4a-4f7e-9a51-3c2d1e0f9a8b",'
    '"scope":{"user_id":"alice","persona_id":"","agent_id":""},"content":"Imported fact",'
    '"triple":null,"category":"context","role":"context","confidence":0.9,'
    '"reinforced_count":0,"pinned":false,"status":"active",'
    '"valid_from":"2026-11-01T09:00:00Z","invalid_at":null,"recorded_at":"2026-11-01T09:00:00Z",'
    '"last_reinforced_at":null,"last_referenced_at":null,"supersedes_id":null,'
    '"superseded_by_id":null,"source_message_ids":[],"session_id":"","ingest_id":null,'
    '"origin":"explicit","correction_reason":"","retention_policy":"user-controlled",'
    '"expires_at":null,"sharing":{"all_agents":false,"all_personas":false},"demoted":null}'
)


def valid_requests(method: str, known: Known) -> st.SearchStrategy[Message]:
    """A well-formed request of each RPC (naming seeded things), for mutations to start from:
    a request that passes validation reaches the storage, embedding and ranking code."""
    memory_ids = st.sampled_from(known.memory_ids)
    keys = st.uuids().map(str)
    scopes = st.sampled_from(
        [
            ALICE,
            pb.Scope(user_id="alice", persona_id="nova"),
            pb.Scope(user_id="alice", agent_id="bot-1"),
        ]
    )
    message = st.builds(
        lambda mid, text: pb.Message(
            message_id=mid,
            sender_id="alice",
            role=pb.MESSAGE_ROLE_USER,
            text=text,
            sent_at=SENT_AT,
        ),
        keys,
        st.sampled_from(["I live in Lisbon", "My sister is called Ana", "I don't eat meat"]),
    )
    builders: dict[str, st.SearchStrategy[Message]] = {
        "Remember": st.builds(
            lambda sc, text: pb.RememberRequest(scope=sc, content=text, category="preference"),
            scopes,
            st.sampled_from(["I like green tea", "I live in Lisbon", "我喜欢喝咖啡"]),
        ),
        "Correct": st.builds(
            lambda mid, key: pb.CorrectRequest(
                scope=ALICE, memory_id=mid, new_content=f"corrected {key}", reason="fuzz"
            ),
            memory_ids,
            keys,
        ),
        "Forget": st.builds(
            lambda mids: pb.ForgetRequest(scope=ALICE, memory_ids=mids),
            st.lists(memory_ids, min_size=1, max_size=2),
        ),
        "ListMemories": st.builds(
            lambda token: pb.ListMemoriesRequest(scope=ALICE, page_size=2, page_token=token),
            st.sampled_from(["", *known.page_tokens]),
        ),
        "GetMemoryHistory": st.builds(
            lambda sc, mid: pb.GetMemoryHistoryRequest(scope=sc, memory_id=mid), scopes, memory_ids
        ),
        "ListSessions": st.builds(
            lambda sc, size, token: pb.ListSessionsRequest(
                scope=sc, page_size=size, page_token=token
            ),
            scopes,
            st.sampled_from([0, 1, 500]),
            st.sampled_from(["", *known.page_tokens]),
        ),
        "ListEpisodes": st.builds(
            lambda sc, session: pb.ListEpisodesRequest(scope=sc, page_size=2, session_id=session),
            scopes,
            st.sampled_from(["", "s1", "s-fuzz"]),
        ),
        "ForgetSession": st.builds(
            lambda sc, session: pb.ForgetSessionRequest(scope=sc, session_id=session),
            scopes,
            st.sampled_from(["s1", "s-fuzz", "never-ingested"]),
        ),
        "UpdateMemory": st.builds(
            lambda mid, paths: pb.UpdateMemoryRequest(
                scope=ALICE,
                memory_id=mid,
                update_mask=FieldMask(paths=paths),
                pinned=True,
                category="profile",
                role="detail",
                confidence=0.8,
                reason="fuzz",
            ),
            memory_ids,
            st.lists(st.sampled_from(["pinned", "category", "role", "confidence"]), min_size=1),
        ),
        "GetMemory": st.builds(
            lambda sc, mid: pb.GetMemoryRequest(scope=sc, memory_id=mid), scopes, memory_ids
        ),
        "GetCoreBlocks": st.builds(lambda sc: pb.GetCoreBlocksRequest(scope=sc), scopes),
        "UpdateCoreBlock": st.builds(
            lambda sc, block, mode, text, author, rev: pb.UpdateCoreBlockRequest(
                scope=sc,
                block=block,
                mode=mode,
                text=text,
                author=author,
                reason="fuzz",
                expected_revision=rev,
            ),
            scopes,
            st.sampled_from([pb.CORE_BLOCK_KIND_PERSONA, pb.CORE_BLOCK_KIND_HUMAN]),
            st.sampled_from([pb.CORE_BLOCK_MODE_REPLACE, pb.CORE_BLOCK_MODE_APPEND]),
            st.sampled_from(["Ava is a calm guide.", "Alice is vegetarian.\nShe has a dog."]),
            st.sampled_from(["", "agent", "operator"]),
            st.sampled_from([0, 1, 2]),
        ),
        "GetCoreBlockHistory": st.builds(
            lambda sc, block: pb.GetCoreBlockHistoryRequest(scope=sc, block=block, page_size=5),
            scopes,
            st.sampled_from([pb.CORE_BLOCK_KIND_PERSONA, pb.CORE_BLOCK_KIND_HUMAN]),
        ),
        # Batch and import (issue 15).
        "RememberBatch": st.builds(
            lambda sc, texts, atomic: pb.RememberBatchRequest(
                scope=sc,
                items=[pb.RememberRequest(content=t, pinned=i == 0) for i, t in enumerate(texts)],
                atomic=atomic,
            ),
            scopes,
            st.lists(
                st.sampled_from(["I like green tea", "I live in Lisbon", "我喜欢喝咖啡"]),
                min_size=1,
                max_size=3,
            ),
            st.booleans(),
        ),
        "ImportMemories": st.builds(
            lambda sc, line: pb.ImportMemoriesRequest(scope=sc, json=line),
            scopes,
            st.sampled_from([IMPORT_SUMMARY_LINE, IMPORT_MEMORY_LINE]),
        ),
        # A change stream never ends by itself: the call checks its opening heartbeat.
        "WatchMemories": st.builds(
            lambda sc, whole, after: pb.WatchMemoriesRequest(
                scope=pb.Scope(user_id=sc.user_id) if whole else sc,
                whole_user=whole,
                after_position=after,
            ),
            scopes,
            st.booleans(),
            st.sampled_from([0, 1, 10**12]),
        ),
        "Prefetch": st.builds(
            lambda sc, hint: pb.PrefetchRequest(
                scope=sc, session_id="s-fuzz", hint=hint, budget=pb.PacketBudget(chars=1_000)
            ),
            scopes,
            st.sampled_from(["", "coffee", "where do I live"]),
        ),
        "Recall": st.builds(
            lambda sc, q: pb.RecallRequest(
                scope=sc,
                query=q,
                top_k=5,
                types=[pb.ITEM_TYPE_FACT, pb.ITEM_TYPE_EPISODE, pb.ITEM_TYPE_MESSAGE],
            ),
            scopes,
            st.sampled_from(["where do I live", "咖啡", "tea"]),
        ),
        # One request of a stream: a final (the fuzz sends one message per call).
        "RecallStream": st.builds(
            lambda sc, q, final: pb.RecallStreamRequest(
                scope=sc, query=q, top_k=5, final=final, final_deadline_ms=800
            ),
            scopes,
            st.sampled_from(["where do I live", "咖啡", "tea"]),
            st.booleans(),
        ),
        "Ingest": st.builds(
            lambda key, msgs: pb.IngestRequest(
                scope=ALICE, session_id="s-fuzz", idempotency_key=key, messages=msgs
            ),
            keys,
            st.lists(message, min_size=1, max_size=2, unique_by=lambda m: m.message_id),
        ),
        "ExportMemories": st.builds(
            lambda sc, whole: pb.ExportMemoriesRequest(
                scope=pb.Scope(user_id=sc.user_id) if whole else sc, whole_user=whole
            ),
            scopes,
            st.booleans(),
        ),
        "GetIngestStatus": st.builds(
            lambda iid, with_scope: pb.GetIngestStatusRequest(
                ingest_id=iid, scope=ALICE if with_scope else None
            ),
            st.sampled_from(known.ingest_ids),
            st.booleans(),
        ),
    }
    return builders[method]


@st.composite
def mutated(draw: st.DrawFn, base: Message, known: Known, dim: int, depth: int = 0) -> Message:
    """``base`` with one or two of its fields (at any depth) replaced by fuzzed values."""
    message = type(base)()
    message.CopyFrom(base)
    desc = message.DESCRIPTOR
    names = draw(
        st.lists(
            st.sampled_from([f.name for f in desc.fields]), min_size=1, max_size=2, unique=True
        )
    )
    for name in names:
        field = desc.fields_by_name[name]
        is_message = field.type == descriptor.FieldDescriptor.TYPE_MESSAGE
        if is_message and not field.is_repeated and message.HasField(name) and draw(st.booleans()):
            getattr(message, name).CopyFrom(
                draw(mutated(getattr(message, name), known, dim, depth + 1))
            )
            continue
        items = getattr(message, name) if field.is_repeated else None
        if is_message and items and draw(st.booleans()):
            i = draw(st.integers(0, len(items) - 1))
            items[i].CopyFrom(draw(mutated(items[i], known, dim, depth + 1)))
            continue
        value = draw(field_values(field, known, dim, depth))
        message.ClearField(name)
        assign(message, field, value)
    return message


# -- calls -----------------------------------------------------------------------------------

# Mostly the valid key, so most examples get past authentication.
AUTH_KINDS = ["key"] * 20 + ["bearer"] * 3 + ["missing", "garbage", "revoked", "empty"]


def metadata_for(kind: str, fuzz: FuzzTenant, garbage: str) -> tuple[tuple[str, str], ...]:
    return {
        "key": (("x-api-key", fuzz.caller.key),),
        "bearer": (("authorization", f"Bearer {fuzz.caller.key}"),),
        "missing": (),
        "garbage": (("x-api-key", garbage),),
        "revoked": (("x-api-key", fuzz.revoked_key),),
        "empty": (("x-api-key", ""),),
    }[kind]


printable_ascii = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)


async def call_and_check(
    channel: grpc.aio.Channel,
    pool: asyncpg.Pool,
    fuzz: FuzzTenant,
    method: str,
    payload: Message | bytes,
    metadata: tuple[tuple[str, str], ...],
    *,
    authenticated: bool,
) -> grpc.StatusCode:
    """Send one request, check its status, and that a refused one wrote nothing."""
    raw = isinstance(payload, bytes)
    streaming = SERVICE.methods_by_name[method].server_streaming
    rpc: Callable[..., Any] = (channel.unary_stream if streaming else channel.unary_unary)(
        method_path(method),
        request_serializer=None if raw else request_class(method).SerializeToString,
        response_deserializer=None if raw else response_class(method).FromString,
    )
    await fuzz.settle()
    before = await fingerprint(pool, fuzz)
    try:
        if method == "WatchMemories":
            # Endless by design: the first message (its opening heartbeat) or its refusal.
            call = rpc(payload, metadata=metadata, timeout=CALL_TIMEOUT_S)
            first = await call.read()
            call.cancel()
            assert first is not grpc.aio.EOF, "WatchMemories ended without a message"
        elif streaming:
            async for _ in rpc(payload, metadata=metadata, timeout=CALL_TIMEOUT_S):
                pass
        else:
            await rpc(payload, metadata=metadata, timeout=CALL_TIMEOUT_S)
        code, details = C.OK, ""
    except grpc.aio.AioRpcError as exc:
        code, details = exc.code(), exc.details() or ""
    allowed = ANY_METHOD | PER_METHOD.get(method, set())
    assert code in allowed, f"{method} answered {code.name}: {details}"
    if not authenticated:
        assert code == C.UNAUTHENTICATED, f"{method} without a valid key: {code.name}"
    if code != C.OK:
        assert details, f"{method}: {code.name} without a message"
        after = await fingerprint(pool, fuzz)
        changed = {t for t in before if before[t] != after[t]}
        assert not changed, f"{method} answered {code.name} ({details}) but wrote {changed}"
    return code


# -- the tests -------------------------------------------------------------------------------


@functools.cache
def request_strategy(method: str, known: Known, dim: int) -> st.SearchStrategy[Message]:
    """A quarter any message of the type, three quarters a valid request mutated."""
    anything = messages(request_class(method).DESCRIPTOR, known, dim)
    near_valid = valid_requests(method, known).flatmap(lambda b: mutated(b, known, dim))
    return st.one_of(anything, near_valid, near_valid, near_valid).filter(fits)


@pytest.mark.parametrize("method", METHODS)
@FUZZ_SETTINGS
@given(data=st.data())
async def test_every_request_message_is_answered_well(
    method: str,
    fuzz: FuzzTenant,
    known: Known,
    channel: grpc.aio.Channel,
    pool: asyncpg.Pool,
    settings: Settings,
    data: st.DataObject,
) -> None:
    request = data.draw(request_strategy(method, known, settings.embedding_dim), label="request")
    auth = data.draw(st.sampled_from(AUTH_KINDS), label="auth")
    garbage = data.draw(printable_ascii, label="garbage key") if auth == "garbage" else ""
    await call_and_check(
        channel,
        pool,
        fuzz,
        method,
        request,
        metadata_for(auth, fuzz, garbage),
        authenticated=auth in ("key", "bearer"),
    )


# -- raw bytes -------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@st.composite
def wire_fields(draw: st.DrawFn) -> bytes:
    """One field in protobuf wire format, often almost right: a known field number with the
    wrong wire type, a length past the end, invalid UTF-8 in a string, a group that never
    ends, a truncated varint."""
    number = draw(st.one_of(st.integers(1, 24), st.integers(0, 2**29 - 1)))
    wire_type = draw(st.integers(0, 7))
    tag = varint((number << 3) | wire_type)
    if wire_type == 0:
        body = draw(st.one_of(st.integers(0, 2**64 - 1).map(varint), st.just(b"\xff" * 11)))
    elif wire_type == 1:
        body = draw(st.binary(min_size=0, max_size=8))
    elif wire_type == 2:
        payload = draw(
            st.one_of(
                st.binary(max_size=40),
                st.sampled_from(
                    [b"\xff\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"a\x80b", b"\xf4\x90"]
                ),
                st.text(max_size=20).map(lambda t: t.encode("utf-8")),
            )
        )
        length = draw(st.one_of(st.just(len(payload)), st.integers(0, 2**35)))
        body = varint(length) + payload
    elif wire_type == 5:
        body = draw(st.binary(min_size=0, max_size=4))
    else:
        body = draw(st.binary(max_size=8))
    return tag + body


@st.composite
def corrupted(draw: st.DrawFn, valid: bytes) -> bytes:
    """A valid request with bytes flipped, cut, inserted or a field appended."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "append"]))
        if op == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
        elif op == "cut" and data:
            del data[draw(st.integers(0, len(data) - 1)) :]
        elif op == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        else:
            data += draw(wire_fields())
    return bytes(data)


@functools.cache
def payload_strategy(method: str, known: Known) -> st.SearchStrategy[bytes]:
    valid = valid_requests(method, known).map(lambda m: m.SerializeToString())
    return st.one_of(
        st.binary(max_size=300),
        st.lists(wire_fields(), min_size=1, max_size=6).map(b"".join),
        valid.flatmap(corrupted),
    )


@pytest.mark.parametrize("method", METHODS)
@hypothesis_settings(FUZZ_SETTINGS, max_examples=25)
@given(data=st.data())
async def test_bytes_that_are_not_a_request_are_refused_cleanly(
    method: str,
    fuzz: FuzzTenant,
    known: Known,
    channel: grpc.aio.Channel,
    pool: asyncpg.Pool,
    data: st.DataObject,
) -> None:
    payload = data.draw(payload_strategy(method, known), label="payload")
    await call_and_check(
        channel, pool, fuzz, method, payload, metadata_for("key", fuzz, ""), authenticated=True
    )


@pytest.mark.parametrize("over", [1, 4 * 1024 * 1024 + 1])
@pytest.mark.parametrize("method", METHODS)
async def test_a_request_over_the_size_limit_is_refused_and_writes_nothing(
    method: str,
    over: int,
    fuzz: FuzzTenant,
    channel: grpc.aio.Channel,
    pool: asyncpg.Pool,
    settings: Settings,
) -> None:
    size = settings.max_request_bytes + over
    code = await call_and_check(
        channel,
        pool,
        fuzz,
        method,
        b"\x12" + varint(size) + b"x" * size,
        metadata_for("key", fuzz, ""),
        authenticated=True,
    )
    # gRPC's own limit answers RESOURCE_EXHAUSTED; a server that reads the size first may
    # name it in an INVALID_ARGUMENT.
    assert code in (C.RESOURCE_EXHAUSTED, C.INVALID_ARGUMENT)
