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
