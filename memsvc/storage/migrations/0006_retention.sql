-- Retention: what expires, and the indexes the expiry task deletes by.

-- An episode is derived from its session's messages, so it expires with the last of them
-- (the workers set it from the messages' expiry when they build it; NULL: never).
ALTER TABLE episodes ADD COLUMN expires_at timestamptz;

-- The expiry task takes the oldest expired rows first, a bounded batch at a time; only rows
-- that expire at all are indexed.
CREATE INDEX memories_expiry ON memories (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX messages_expiry ON messages (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX episodes_expiry ON episodes (expires_at) WHERE expires_at IS NOT NULL;

-- The end of a session deletes that session's SESSION memories of the scope.
CREATE INDEX memories_session_retention
    ON memories (tenant_id, user_id, persona_id, agent_id, session_id)
    WHERE retention_policy = 'session';
