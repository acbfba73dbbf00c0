-- Sessions: ListSessions, ListEpisodes and ForgetSession.

-- The sessions a fact was stated in besides its own session_id (its first): an extraction
-- that reinforced it in another session adds that session, an explicit write (Remember)
-- outside any session adds '' (see storage.sessions for how ForgetSession uses it).
-- Source message ids alone cannot say this: they are the caller's ids, unique per session.
ALTER TABLE memories ADD COLUMN also_stated_in text[] NOT NULL DEFAULT '{}';
-- Rows written before: sessions of the owner whose messages are among the fact's sources.
UPDATE memories m SET also_stated_in = ARRAY(
    SELECT DISTINCT g.session_id FROM messages g
    WHERE g.tenant_id = m.tenant_id AND g.user_id = m.user_id
      AND g.message_id = ANY(m.source_message_ids) AND g.session_id <> m.session_id
    ORDER BY 1)
WHERE cardinality(m.source_message_ids) > 0;

-- ListSessions groups a scope's messages by session (an index-only scan, sessions in order).
CREATE INDEX messages_scope_session
    ON messages (tenant_id, user_id, persona_id, agent_id, session_id, sent_at)
    INCLUDE (expires_at);
-- A session's facts (its counts, ForgetSession).
CREATE INDEX memories_scope_session
    ON memories (tenant_id, user_id, persona_id, agent_id, session_id);
-- A session's ingest jobs (whether it ended, ForgetSession).
CREATE INDEX ingest_outbox_scope_session
    ON ingest_outbox (tenant_id, user_id, persona_id, agent_id, session_id);
