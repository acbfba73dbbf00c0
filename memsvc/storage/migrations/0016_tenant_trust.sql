-- Trust among tenants (issue 31).
--
-- An Ingest idempotency key is unique per user, on a single PostgreSQL as on Citus (where a
-- unique constraint must hold the distribution column): before, one node kept it per tenant,
-- so user B's Ingest with a key user A had used answered A's ingest as a duplicate and B's
-- messages were never stored. The row also keeps a digest of the request as stored (scope,
-- session, messages, goals: ingest.fingerprint), so a key reused for another request is
-- refused (ALREADY_EXISTS) instead of answered as a duplicate. NULL for rows written before.
ALTER TABLE ingest_outbox DROP CONSTRAINT IF EXISTS ingest_outbox_tenant_id_idempotency_key_key;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conname = 'ingest_outbox_user_idempotency_key') THEN
        ALTER TABLE ingest_outbox ADD CONSTRAINT ingest_outbox_user_idempotency_key
            UNIQUE (tenant_id, user_id, idempotency_key);
    END IF;
END $$;
ALTER TABLE ingest_outbox ADD COLUMN IF NOT EXISTS request_digest text;

-- Change positions per user, as on Citus (storage.citus_triggers): a user's next position is
-- greatest(their last position + 1, now in microseconds). They came from one global sequence,
-- so the gaps in tenant A's positions counted tenant B's writes. Still strictly increasing per
-- user in commit order (the user's lock is held until the commit is visible, as before), and
-- never lower after an erasure (the clock moved on). The sequence stays for old databases'
-- sake but is no longer read.
CREATE OR REPLACE FUNCTION memsvc_changes_commit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    u record;
    last bigint;
    stamp timestamptz := clock_timestamp();
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
        SELECT greatest(
            (SELECT max(position) FROM memory_changes
             WHERE tenant_id = u.tenant_id AND user_id = u.user_id),
            (SELECT pruned_through FROM memory_change_horizons
             WHERE tenant_id = u.tenant_id AND user_id = u.user_id),
            (extract(epoch FROM stamp) * 1000000)::bigint - 1) INTO last;
        UPDATE memory_changes c
        SET position = last + p.n, changed_at = stamp, version = coalesce(
            (SELECT v.version FROM scope_versions v
             WHERE v.tenant_id = u.tenant_id AND v.user_id = u.user_id), 0)
        FROM (SELECT change_id, row_number() OVER (ORDER BY change_id) AS n
              FROM memory_changes
              WHERE tenant_id = u.tenant_id AND user_id = u.user_id
                AND position IS NULL AND txid = NEW.txid) AS p
        WHERE c.tenant_id = u.tenant_id AND c.user_id = u.user_id
          AND c.change_id = p.change_id;
    END LOOP;
    RETURN NULL;
END $$;
