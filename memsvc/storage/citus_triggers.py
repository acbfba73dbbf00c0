"""The change-log triggers as Citus runs them: per row, per user, without a global sequence.

On Citus a trigger fires on the shard, on the worker holding it, and its statements go
through Citus there; five things of the single-PostgreSQL triggers (migrations 0003, 0008,
0011) do not survive that, so storage.citus swaps in these before it distributes the tables:

- statement triggers read their transition tables (``REFERENCING NEW TABLE AS born``) inside
  an INSERT ... SELECT into another distributed table, which Citus executes without the
  tuplestore ("could not find named tuplestore"): here they are row triggers, and each row's
  INSERT is a single-shard statement on the colocated shard (local execution, same
  transaction);
- the commit trigger numbered every user of the transaction from one statement over
  ``memory_changes`` (every shard): here it numbers only its own row's user (a router
  statement), under that user's lock as before;
- positions came from ``memory_change_position_seq``, which exists on the coordinator only:
  here a user's next position is ``greatest(their last position + 1, now in microseconds)``.
  Still strictly increasing per user in commit order (the user's lock is held until the
  commit is visible, as before), never lower after an erasure (the clock moved on), and it
  survives a shard moving to another worker (the last position moves with the shard). The
  clocks of the workers only have to agree to within the time between two changes of one
  user seen by one reader, which the last-position term covers anyway for the same shard;
- a row written by a multi-row INSERT ... SELECT (RememberBatch, import) reaches its shard
  in a Citus task (a COPY), where Citus refuses the trigger's statement as a "distributed
  query from a query on a shard"; the trigger functions allow that nested execution
  (``citus.allow_nested_distributed_execution``): each writes only the same user's rows of
  a colocated table, on the same node;
- ``pg_notify`` is gone from the shards (the outbox trigger and the commit trigger's): on a
  worker nobody listens, and a worker's part of a transaction over several nodes (a meeting's
  job writes to each speaker's shard) cannot be prepared for two-phase commit once it has
  notified ("cannot PREPARE a transaction that has executed ... NOTIFY").

The delete kind (``memsvc.change_kind``, storage.changes.deletes_recorded_as) reaches these
triggers because it is set with SET LOCAL, which Citus forwards to the workers of the
transaction (storage.citus sets ``citus.propagate_set_commands``). The writers notify from
the coordinator instead, in the writing transaction: Ingest wakes the outbox workers
(outbox.wake), every write of memories or core blocks the change watchers
(changes.Waker).
"""

from __future__ import annotations

ROW_TRIGGERS_SQL = r"""
CREATE OR REPLACE FUNCTION memsvc_citus_memory_inserted() RETURNS trigger
LANGUAGE plpgsql SET citus.allow_nested_distributed_execution = on AS $$
BEGIN
    INSERT INTO memory_changes (tenant_id, user_id, persona_id, agent_id, kind, memory_id)
    VALUES (NEW.tenant_id, NEW.user_id, NEW.persona_id, NEW.agent_id, 'created', NEW.memory_id);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION memsvc_citus_memory_updated() RETURNS trigger
LANGUAGE plpgsql SET citus.allow_nested_distributed_execution = on AS $$
BEGIN
    IF (OLD.content, OLD.subject, OLD.predicate, OLD.object, OLD.category, OLD.role,
        OLD.confidence, OLD.reinforced_count, OLD.pinned, OLD.valid_from, OLD.invalid_at,
        OLD.status, OLD.shared_all_agents, OLD.shared_all_personas, OLD.retention_policy,
        OLD.expires_at, OLD.demoted_at, OLD.superseded_by_id, OLD.updated_at)
       IS NOT DISTINCT FROM
       (NEW.content, NEW.subject, NEW.predicate, NEW.object, NEW.category, NEW.role,
        NEW.confidence, NEW.reinforced_count, NEW.pinned, NEW.valid_from, NEW.invalid_at,
        NEW.status, NEW.shared_all_agents, NEW.shared_all_personas, NEW.retention_policy,
        NEW.expires_at, NEW.demoted_at, NEW.superseded_by_id, NEW.updated_at) THEN
        RETURN NULL;
    END IF;
    INSERT INTO memory_changes
        (tenant_id, user_id, persona_id, agent_id, kind, memory_id, superseded_by_id)
    VALUES (NEW.tenant_id, NEW.user_id, NEW.persona_id, NEW.agent_id,
            CASE WHEN OLD.invalid_at IS NULL AND NEW.invalid_at IS NOT NULL
                 THEN 'superseded' ELSE 'updated' END,
            NEW.memory_id,
            CASE WHEN OLD.invalid_at IS NULL AND NEW.invalid_at IS NOT NULL
                 THEN NEW.superseded_by_id END);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION memsvc_citus_memory_deleted() RETURNS trigger
LANGUAGE plpgsql SET citus.allow_nested_distributed_execution = on AS $$
DECLARE
    k text := memsvc_change_kind('forgotten');
BEGIN
    DELETE FROM memory_references
    WHERE tenant_id = OLD.tenant_id AND user_id = OLD.user_id AND memory_id = OLD.memory_id;
    IF k <> 'none' THEN
        INSERT INTO memory_changes (tenant_id, user_id, persona_id, agent_id, kind, memory_id)
        VALUES (OLD.tenant_id, OLD.user_id, OLD.persona_id, OLD.agent_id, k, OLD.memory_id);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION memsvc_citus_core_block_written() RETURNS trigger
LANGUAGE plpgsql SET citus.allow_nested_distributed_execution = on AS $$
BEGIN
    INSERT INTO memory_changes (tenant_id, user_id, persona_id, agent_id, kind, block)
    VALUES (NEW.tenant_id, NEW.user_id, NEW.persona_id, NEW.agent_id, 'core_block_updated',
            NEW.block);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION memsvc_citus_changes_commit() RETURNS trigger
LANGUAGE plpgsql SET citus.allow_nested_distributed_execution = on AS $$
DECLARE
    last bigint;
    -- A variable, not clock_timestamp() in the UPDATE: Citus refuses volatile functions there.
    stamp timestamptz := clock_timestamp();
BEGIN
    PERFORM 1 FROM memory_changes
    WHERE tenant_id = NEW.tenant_id AND user_id = NEW.user_id AND change_id = NEW.change_id
      AND position IS NULL;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(NEW.tenant_id || E'\x1f' || NEW.user_id, 13));
    SELECT greatest(
        (SELECT max(position) FROM memory_changes
         WHERE tenant_id = NEW.tenant_id AND user_id = NEW.user_id),
        (SELECT pruned_through FROM memory_change_horizons
         WHERE tenant_id = NEW.tenant_id AND user_id = NEW.user_id),
        (extract(epoch FROM stamp) * 1000000)::bigint - 1) INTO last;
    UPDATE memory_changes c
    SET position = last + p.n, changed_at = stamp, version = coalesce(
        (SELECT v.version FROM scope_versions v
         WHERE v.tenant_id = NEW.tenant_id AND v.user_id = NEW.user_id), 0)
    FROM (SELECT change_id, row_number() OVER (ORDER BY change_id) AS n
          FROM memory_changes
          WHERE tenant_id = NEW.tenant_id AND user_id = NEW.user_id
            AND position IS NULL AND txid = NEW.txid) AS p
    WHERE c.tenant_id = NEW.tenant_id AND c.user_id = NEW.user_id
      AND c.change_id = p.change_id;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS memories_changes_insert ON memories;
DROP TRIGGER IF EXISTS memories_changes_update ON memories;
DROP TRIGGER IF EXISTS memories_changes_delete ON memories;
DROP TRIGGER IF EXISTS memories_forget_references ON memories;
DROP TRIGGER IF EXISTS core_block_revisions_changes ON core_block_revisions;
DROP TRIGGER IF EXISTS memory_changes_commit ON memory_changes;
DROP TRIGGER IF EXISTS memories_citus_changes_insert ON memories;
DROP TRIGGER IF EXISTS memories_citus_changes_update ON memories;
DROP TRIGGER IF EXISTS memories_citus_changes_delete ON memories;
DROP TRIGGER IF EXISTS core_block_revisions_citus_changes ON core_block_revisions;
DROP TRIGGER IF EXISTS memory_changes_citus_commit ON memory_changes;
-- NOTIFY on a shard: nobody listens on a worker, and a worker's part of a transaction that
-- spans nodes cannot be prepared for two-phase commit once it has notified.
DROP TRIGGER IF EXISTS ingest_outbox_notify ON ingest_outbox;

CREATE TRIGGER memories_citus_changes_insert AFTER INSERT ON memories
    FOR EACH ROW EXECUTE FUNCTION memsvc_citus_memory_inserted();
CREATE TRIGGER memories_citus_changes_update AFTER UPDATE ON memories
    FOR EACH ROW EXECUTE FUNCTION memsvc_citus_memory_updated();
CREATE TRIGGER memories_citus_changes_delete AFTER DELETE ON memories
    FOR EACH ROW EXECUTE FUNCTION memsvc_citus_memory_deleted();
CREATE TRIGGER core_block_revisions_citus_changes AFTER INSERT ON core_block_revisions
    FOR EACH ROW EXECUTE FUNCTION memsvc_citus_core_block_written();
CREATE CONSTRAINT TRIGGER memory_changes_citus_commit AFTER INSERT ON memory_changes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION memsvc_citus_changes_commit();
"""

# Triggers storage.citus expects on the distributed tables afterwards (its tests check them).
ROW_TRIGGERS: dict[str, tuple[str, ...]] = {
    "memories": (
        "memories_citus_changes_insert",
        "memories_citus_changes_update",
        "memories_citus_changes_delete",
    ),
    "core_block_revisions": ("core_block_revisions_citus_changes",),
    "memory_changes": ("memory_changes_citus_commit",),
    "ingest_outbox": (),
}
