-- Write path: per-speaker extraction idempotency, outbox wake-ups, extraction provenance.

-- One row per (ingest job, speaker scope) whose extraction committed: a re-run of the job
-- skips that speaker, so retries and takeovers never add anything twice.
CREATE TABLE extraction_runs (
    tenant_id   text NOT NULL,
    user_id     text NOT NULL,
    persona_id  text NOT NULL DEFAULT '',
    agent_id    text NOT NULL DEFAULT '',
    ingest_id   uuid NOT NULL,
    session_id  text NOT NULL,
    outcome     jsonb NOT NULL DEFAULT '{}'::jsonb,
    finished_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, user_id, persona_id, agent_id, ingest_id)
);

-- Workers LISTEN on this channel instead of polling; the payload is the tenant and user so
-- a worker could route, but any worker may claim any job.
CREATE FUNCTION memsvc_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('memsvc_outbox', NEW.tenant_id || ':' || NEW.user_id);
    RETURN NULL;
END;
$$;
CREATE TRIGGER ingest_outbox_notify AFTER INSERT ON ingest_outbox
    FOR EACH ROW EXECUTE FUNCTION memsvc_outbox_notify();

-- Pending work of one user, for the drain kicked by that user's reads.
CREATE INDEX ingest_outbox_user_ready ON ingest_outbox (tenant_id, user_id, available_at)
    WHERE state IN ('pending', 'processing');

-- Where an extracted memory came from.
ALTER TABLE memories ADD COLUMN ingest_id uuid;
-- Which messages a job processes: the ones it stored.
CREATE INDEX messages_ingest ON messages (tenant_id, user_id, ingest_id);
