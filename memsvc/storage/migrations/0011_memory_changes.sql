-- The change stream (WatchMemories): one row per change to a memory, written by triggers in
-- the writing transaction itself, so no write path can forget to record one.
--
-- Positions are given at COMMIT, in commit order per user: a deferred constraint trigger
-- takes the user's change lock (a transaction-level advisory lock, held until after the
-- commit is visible: PostgreSQL ends a transaction in the proc array before it releases its
-- locks), then numbers the transaction's rows from one global sequence. So for one user, a
-- position is only ever given after every lower one is visible, and a reader resuming
-- "after position P" can never miss a change committed later with a lower position.
CREATE SEQUENCE memory_change_position_seq;

CREATE TABLE memory_changes (
    tenant_id        text NOT NULL,
    user_id          text NOT NULL,
    change_id        bigint GENERATED ALWAYS AS IDENTITY,
    persona_id       text NOT NULL DEFAULT '',
    agent_id         text NOT NULL DEFAULT '',
    -- NULL until the writing transaction commits (never visible to others while NULL).
    position         bigint,
    kind             text NOT NULL CHECK (kind IN ('created', 'superseded', 'updated',
                         'forgotten', 'expired', 'core_block_updated', 'erased')),
    memory_id        uuid,
    superseded_by_id uuid,
    block            text,
    -- The user's content version (scope_versions) after the transaction; set at commit.
    version          bigint,
    changed_at       timestamptz NOT NULL DEFAULT now(),
    -- The writing (top-level) transaction: its rows are numbered together at commit.
    txid             bigint NOT NULL DEFAULT txid_current(),
    PRIMARY KEY (tenant_id, user_id, change_id)
);
CREATE UNIQUE INDEX memory_changes_position ON memory_changes (tenant_id, user_id, position);
CREATE INDEX memory_changes_pending ON memory_changes (txid) WHERE position IS NULL;
CREATE INDEX memory_changes_age ON memory_changes (changed_at);

-- Per user, the highest position pruned by retention: resuming below it is OUT_OF_RANGE
-- (changes were dropped), never a silently short stream.
CREATE TABLE memory_change_horizons (
    tenant_id      text NOT NULL,
    user_id        text NOT NULL,
    pruned_through bigint NOT NULL,
    PRIMARY KEY (tenant_id, user_id)
);

-- At commit: lock every user of the transaction (sorted: no deadlock between two commits),
-- number the rows, stamp version and time, and wake the listeners (once per user: NOTIFY
-- folds identical payloads of one transaction). The first row's call does the whole
-- transaction; the others find their row numbered (or deleted, by erasure) and return.
CREATE FUNCTION memsvc_changes_commit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    u record;
BEGIN
    PERFORM 1 FROM memory_changes
    WHERE tenant_id = NEW.tenant_id AND user_id = NEW.user_id AND change_id = NEW.change_id
      AND position IS NULL;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    FOR u IN SELECT DISTINCT tenant_id, user_id FROM memory_changes
             WHERE position IS NULL AND txid = NEW.txid ORDER BY 1, 2 LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(u.tenant_id || E'\x1f' || u.user_id, 13));
        -- Delivered after the commit, once per payload however many rows.
        PERFORM pg_notify('memsvc_changes', u.tenant_id || E'\x1f' || u.user_id);
    END LOOP;
    UPDATE memory_changes c
    SET position = p.position, changed_at = clock_timestamp(), version = coalesce(
        (SELECT v.version FROM scope_versions v
         WHERE v.tenant_id = c.tenant_id AND v.user_id = c.user_id), 0)
    FROM (SELECT tenant_id, user_id, change_id,
                 nextval('memory_change_position_seq') AS position
          FROM (SELECT tenant_id, user_id, change_id FROM memory_changes
                WHERE position IS NULL AND txid = NEW.txid
                ORDER BY change_id) AS ordered) AS p
    WHERE c.tenant_id = p.tenant_id AND c.user_id = p.user_id AND c.change_id = p.change_id;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER memory_changes_commit AFTER INSERT ON memory_changes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION memsvc_changes_commit();

-- What a deleting transaction says its deletes are: '' (default) forgotten, 'expired'
-- (retention), 'none' (erasure records its own single row).
CREATE FUNCTION memsvc_change_kind(fallback text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('memsvc.change_kind', true), ''), fallback)
$$;

CREATE FUNCTION memsvc_memories_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO memory_changes (tenant_id, user_id, persona_id, agent_id, kind, memory_id)
    SELECT tenant_id, user_id, persona_id, agent_id, 'created', memory_id FROM born;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_changes_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS born FOR EACH STATEMENT EXECUTE FUNCTION memsvc_memories_inserted();

-- Only what a reader of the memory sees counts as an update: not embeddings, provenance
-- lists, reference or reinforcement times (reinforced_count does count). updated_at is
-- migration 0010's (UpdateMemory).
CREATE FUNCTION memsvc_memories_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO memory_changes
        (tenant_id, user_id, persona_id, agent_id, kind, memory_id, superseded_by_id)
    SELECT n.tenant_id, n.user_id, n.persona_id, n.agent_id,
           CASE WHEN o.invalid_at IS NULL AND n.invalid_at IS NOT NULL
                THEN 'superseded' ELSE 'updated' END,
           n.memory_id,
           CASE WHEN o.invalid_at IS NULL AND n.invalid_at IS NOT NULL
                THEN n.superseded_by_id END
    FROM before_rows o
    JOIN after_rows n ON n.tenant_id = o.tenant_id AND n.user_id = o.user_id
                     AND n.memory_id = o.memory_id
    WHERE (o.content, o.subject, o.predicate, o.object, o.category, o.role, o.confidence,
           o.reinforced_count, o.pinned, o.valid_from, o.invalid_at, o.status,
           o.shared_all_agents, o.shared_all_personas, o.retention_policy, o.expires_at,
           o.demoted_at, o.superseded_by_id, o.updated_at)
          IS DISTINCT FROM
          (n.content, n.subject, n.predicate, n.object, n.category, n.role, n.confidence,
           n.reinforced_count, n.pinned, n.valid_from, n.invalid_at, n.status,
           n.shared_all_agents, n.shared_all_personas, n.retention_policy, n.expires_at,
           n.demoted_at, n.superseded_by_id, n.updated_at);
    RETURN NULL;
END $$;
CREATE TRIGGER memories_changes_update AFTER UPDATE ON memories
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memsvc_memories_updated();

CREATE FUNCTION memsvc_memories_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k text := memsvc_change_kind('forgotten');
BEGIN
    IF k = 'none' THEN
        RETURN NULL;
    END IF;
    INSERT INTO memory_changes (tenant_id, user_id, persona_id, agent_id, kind, memory_id)
    SELECT tenant_id, user_id, persona_id, agent_id, k, memory_id FROM gone_rows;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_changes_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS gone_rows FOR EACH STATEMENT
    EXECUTE FUNCTION memsvc_memories_deleted();

-- A core block written (migration 0009): one change per revision, memory_id empty.
CREATE FUNCTION memsvc_core_block_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO memory_changes (tenant_id, user_id, persona_id, agent_id, kind, block)
    SELECT tenant_id, user_id, persona_id, agent_id, 'core_block_updated', block FROM written;
    RETURN NULL;
END $$;
CREATE TRIGGER core_block_revisions_changes AFTER INSERT ON core_block_revisions
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT
    EXECUTE FUNCTION memsvc_core_block_written();
