-- memsvc schema v1: every tier the service needs, each row keyed by tenant and scope.
-- Every table leads with (tenant_id, user_id) so the schema can be distributed by user on
-- Citus later, and every query filters on them. {embedding_dim} is filled in at migrate time.

CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS pg_trgm;

CREATE TABLE memsvc_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO memsvc_meta (key, value) VALUES ('embedding_dim', '{embedding_dim}');

-- API keys, stored as SHA-256 of the key (keys are 256-bit random: a slow hash adds nothing).
CREATE TABLE api_keys (
    key_hash    bytea PRIMARY KEY,
    tenant_id   text NOT NULL,
    label       text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- Durable memories (facts). Bitemporal: valid_from/invalid_at say when the fact held,
-- recorded_at when memsvc learned it. Superseded rows stay for history; reads filter
-- invalid_at IS NULL. lineage_id groups every version of one memory (erasure removes all).
CREATE TABLE memories (
    tenant_id          text NOT NULL,
    user_id            text NOT NULL,
    persona_id         text NOT NULL DEFAULT '',
    agent_id           text NOT NULL DEFAULT '',
    shared_all_agents  boolean NOT NULL DEFAULT false,
    shared_all_personas boolean NOT NULL DEFAULT false,
    memory_id          uuid NOT NULL,
    lineage_id         uuid NOT NULL,
    content            text NOT NULL,
    content_hash       bytea NOT NULL,
    subject            text NOT NULL DEFAULT '',
    predicate          text NOT NULL DEFAULT '',
    object             text NOT NULL DEFAULT '',
    category           text NOT NULL,
    role               text NOT NULL,
    confidence         real NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    reinforced_count   integer NOT NULL DEFAULT 0,
    pinned             boolean NOT NULL DEFAULT false,
    valid_from         timestamptz NOT NULL,
    invalid_at         timestamptz,
    recorded_at        timestamptz NOT NULL DEFAULT now(),
    last_reinforced_at timestamptz,
    last_referenced_at timestamptz,
    supersedes_id      uuid,
    superseded_by_id   uuid,
    source_message_ids text[] NOT NULL DEFAULT '{}',
    session_id         text NOT NULL DEFAULT '',
    origin             text NOT NULL,
    correction_reason  text NOT NULL DEFAULT '',
    status             text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'superseded')),
    retention_policy   text NOT NULL DEFAULT 'user-controlled',
    expires_at         timestamptz,
    -- The embedding projection: which model produced it and whether it is usable.
    embedding          vector({embedding_dim}),
    embedding_model    text NOT NULL DEFAULT '',
    embedding_state    text NOT NULL DEFAULT 'missing'
                       CHECK (embedding_state IN ('ok', 'missing', 'stale')),
    search_tsv         tsvector GENERATED ALWAYS AS (
                           to_tsvector('english'::regconfig, content)) STORED,
    PRIMARY KEY (tenant_id, user_id, memory_id)
);
-- Exact-duplicate detection among active memories of one exact scope (race-free reinforce).
CREATE UNIQUE INDEX memories_active_dedup
    ON memories (tenant_id, user_id, persona_id, agent_id, content_hash)
    WHERE invalid_at IS NULL;
CREATE INDEX memories_scope_recent
    ON memories (tenant_id, user_id, persona_id, agent_id, recorded_at DESC, memory_id DESC);
CREATE INDEX memories_lineage ON memories (tenant_id, user_id, lineage_id);
CREATE INDEX memories_embedding_hnsw ON memories USING hnsw (embedding vector_cosine_ops);
CREATE INDEX memories_tsv ON memories USING gin (search_tsv);
CREATE INDEX memories_trgm ON memories USING gin (content gin_trgm_ops);
CREATE INDEX memories_repair ON memories (embedding_state) WHERE embedding_state <> 'ok';

-- The searchable conversation history (recall tier), written by Ingest.
CREATE TABLE messages (
    tenant_id        text NOT NULL,
    user_id          text NOT NULL,
    persona_id       text NOT NULL DEFAULT '',
    agent_id         text NOT NULL DEFAULT '',
    session_id       text NOT NULL,
    message_id       text NOT NULL,
    ingest_id        uuid NOT NULL,
    sender_id        text NOT NULL,
    role             text NOT NULL CHECK (role IN ('user', 'assistant', 'system', 'tool')),
    text             text NOT NULL,
    sent_at          timestamptz NOT NULL,
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    retention_policy text NOT NULL DEFAULT 'ttl',
    expires_at       timestamptz,
    embedding        vector({embedding_dim}),
    embedding_model  text NOT NULL DEFAULT '',
    embedding_state  text NOT NULL DEFAULT 'missing'
                     CHECK (embedding_state IN ('ok', 'missing', 'stale')),
    search_tsv       tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, text)) STORED,
    PRIMARY KEY (tenant_id, user_id, persona_id, agent_id, session_id, message_id)
);
CREATE INDEX messages_scope_time
    ON messages (tenant_id, user_id, persona_id, agent_id, sent_at DESC);
CREATE INDEX messages_embedding_hnsw ON messages USING hnsw (embedding vector_cosine_ops);
CREATE INDEX messages_tsv ON messages USING gin (search_tsv);
CREATE INDEX messages_trgm ON messages USING gin (text gin_trgm_ops);
CREATE INDEX messages_repair ON messages (embedding_state) WHERE embedding_state <> 'ok';

-- Episodes: one per (session, speaker) extraction, with summary and source messages.
CREATE TABLE episodes (
    tenant_id          text NOT NULL,
    user_id            text NOT NULL,
    persona_id         text NOT NULL DEFAULT '',
    agent_id           text NOT NULL DEFAULT '',
    episode_id         uuid NOT NULL,
    session_id         text NOT NULL,
    title              text NOT NULL,
    summary            text NOT NULL,
    excerpt            text NOT NULL DEFAULT '',
    source_message_ids text[] NOT NULL DEFAULT '{}',
    started_at         timestamptz NOT NULL,
    ended_at           timestamptz NOT NULL,
    recorded_at        timestamptz NOT NULL DEFAULT now(),
    embedding          vector({embedding_dim}),
    embedding_model    text NOT NULL DEFAULT '',
    embedding_state    text NOT NULL DEFAULT 'missing'
                       CHECK (embedding_state IN ('ok', 'missing', 'stale')),
    search_tsv         tsvector GENERATED ALWAYS AS (
                           to_tsvector('english'::regconfig, title || ' ' || summary)) STORED,
    PRIMARY KEY (tenant_id, user_id, episode_id),
    -- Extraction idempotency: one episode per session and speaker scope.
    UNIQUE (tenant_id, user_id, persona_id, agent_id, session_id)
);
CREATE INDEX episodes_scope_time
    ON episodes (tenant_id, user_id, persona_id, agent_id, ended_at DESC);
CREATE INDEX episodes_embedding_hnsw ON episodes USING hnsw (embedding vector_cosine_ops);
CREATE INDEX episodes_tsv ON episodes USING gin (search_tsv);

-- Facts an episode produced or reinforced (the episode -> fact walk of Prefetch).
CREATE TABLE episode_memories (
    tenant_id  text NOT NULL,
    user_id    text NOT NULL,
    episode_id uuid NOT NULL,
    memory_id  uuid NOT NULL,
    weight     real NOT NULL DEFAULT 1.0,
    PRIMARY KEY (tenant_id, user_id, episode_id, memory_id),
    FOREIGN KEY (tenant_id, user_id, episode_id)
        REFERENCES episodes (tenant_id, user_id, episode_id) ON DELETE CASCADE,
    FOREIGN KEY (tenant_id, user_id, memory_id)
        REFERENCES memories (tenant_id, user_id, memory_id) ON DELETE CASCADE
);
CREATE INDEX episode_memories_memory ON episode_memories (tenant_id, user_id, memory_id);

-- Topics are owned by one user scope; the persona topic holds the persona description.
CREATE TABLE topics (
    tenant_id       text NOT NULL,
    user_id         text NOT NULL,
    persona_id      text NOT NULL DEFAULT '',
    agent_id        text NOT NULL DEFAULT '',
    topic_id        uuid NOT NULL,
    name            text NOT NULL,
    is_persona      boolean NOT NULL DEFAULT false,
    weight          real NOT NULL DEFAULT 1.0,
    last_episode_at timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    embedding       vector({embedding_dim}),
    embedding_model text NOT NULL DEFAULT '',
    embedding_state text NOT NULL DEFAULT 'missing'
                    CHECK (embedding_state IN ('ok', 'missing', 'stale')),
    search_tsv      tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, name)) STORED,
    PRIMARY KEY (tenant_id, user_id, topic_id),
    UNIQUE (tenant_id, user_id, persona_id, agent_id, name)
);
CREATE INDEX topics_tsv ON topics USING gin (search_tsv);

CREATE TABLE topic_episodes (
    tenant_id  text NOT NULL,
    user_id    text NOT NULL,
    topic_id   uuid NOT NULL,
    episode_id uuid NOT NULL,
    weight     real NOT NULL DEFAULT 1.0,
    PRIMARY KEY (tenant_id, user_id, topic_id, episode_id),
    FOREIGN KEY (tenant_id, user_id, topic_id)
        REFERENCES topics (tenant_id, user_id, topic_id) ON DELETE CASCADE,
    FOREIGN KEY (tenant_id, user_id, episode_id)
        REFERENCES episodes (tenant_id, user_id, episode_id) ON DELETE CASCADE
);

-- The transactional outbox: one row per accepted Ingest, claimed by workers with
-- FOR UPDATE SKIP LOCKED and a lease.
CREATE TABLE ingest_outbox (
    tenant_id       text NOT NULL,
    user_id         text NOT NULL,
    persona_id      text NOT NULL DEFAULT '',
    agent_id        text NOT NULL DEFAULT '',
    ingest_id       uuid NOT NULL,
    idempotency_key text NOT NULL,
    session_id      text NOT NULL,
    payload         jsonb NOT NULL,
    state           text NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'processing', 'done', 'dead')),
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text NOT NULL DEFAULT '',
    result          jsonb NOT NULL DEFAULT '{}'::jsonb,
    available_at    timestamptz NOT NULL DEFAULT now(),
    lease_until     timestamptz,
    leased_by       text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    PRIMARY KEY (tenant_id, user_id, ingest_id),
    UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX ingest_outbox_ready ON ingest_outbox (available_at)
    WHERE state IN ('pending', 'processing');
CREATE INDEX ingest_outbox_by_id ON ingest_outbox (ingest_id);

-- Per-user daily quota of new extracted memories.
CREATE TABLE quota_counters (
    tenant_id text NOT NULL,
    user_id   text NOT NULL,
    day       date NOT NULL,
    inserted  integer NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, user_id, day)
);

-- Version of everything Prefetch may show for one user, bumped in the same transaction as
-- every change. Per user rather than per persona/agent because explicitly shared memories
-- cross those boundaries. Values come from one global sequence, so a version is never
-- reused, even after the row is erased and created again.
CREATE SEQUENCE scope_version_seq;
CREATE TABLE scope_versions (
    tenant_id text NOT NULL,
    user_id   text NOT NULL,
    version   bigint NOT NULL,
    PRIMARY KEY (tenant_id, user_id)
);
