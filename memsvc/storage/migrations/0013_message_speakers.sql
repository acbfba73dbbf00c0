-- Messages carry the speaker's name (Message.sender_name), and a message's retrieval unit is
-- `{name} said, "{text}"` (storage.messages.UNIT_SQL): the dense leg embeds it and the
-- context index holds it with its neighbours' units. The context index no longer holds the
-- message's date (its words matched every question with "may" or a number in it).
ALTER TABLE messages ADD COLUMN sender_name text NOT NULL DEFAULT ''
    CHECK (char_length(sender_name) <= 128);

-- Rows written before: a sender_id made of letters only names the speaker, so their unit
-- changed: re-embedded by the reconciler (stale), and every context index rebuilt.
UPDATE messages SET embedding_state = 'stale'
WHERE embedding_state = 'ok'
  AND sender_id ~ '^[[:alpha:]]+(?:[ .''-][[:alpha:]]+)*$';

WITH s AS (
    SELECT tenant_id, user_id, persona_id, agent_id, session_id, message_id, sent_at,
           CASE WHEN sender_id ~ '^[[:alpha:]]+(?:[ .''-][[:alpha:]]+)*$'
                THEN sender_id || ' said, "' || text || '"' ELSE text END AS unit
    FROM messages
),
w AS (
    SELECT tenant_id, user_id, persona_id, agent_id, session_id, message_id, unit,
           concat_ws(' ', lag(unit) OVER o, lead(unit) OVER o) AS near,
           concat_ws(' ', lag(unit, 2) OVER o, lead(unit, 2) OVER o) AS far
    FROM s
    WINDOW o AS (PARTITION BY tenant_id, user_id, persona_id, agent_id, session_id
                 ORDER BY sent_at, message_id)
)
UPDATE messages m
SET context_tsv = setweight(to_tsvector('english', w.unit), 'A')
               || setweight(to_tsvector('english', w.near), 'B')
               || setweight(to_tsvector('english', w.far), 'C')
FROM w
WHERE m.context_tsv IS NOT NULL
  AND (m.tenant_id, m.user_id, m.persona_id, m.agent_id, m.session_id, m.message_id)
    = (w.tenant_id, w.user_id, w.persona_id, w.agent_id, w.session_id, w.message_id);
