-- A message's vector carries its previous turn in the session: the dense leg embeds
-- `{previous unit}\n{unit}` (storage.messages.EMBED_UNIT_SQL), so a turn whose meaning needs
-- the turn it answers ("Yes, every weekend!" after "Do you still paint?") is found by it.
-- `embed_prev` is the previous turn's unit as the stored vector was made with it; the
-- context index (storage.messages.index_session_context) keeps it current and marks the
-- vector stale when it changes (a neighbour erased, a late turn arriving before it).
ALTER TABLE messages ADD COLUMN embed_prev text;

-- Rows written before: every message that has a previous turn gets it, and its vector (made
-- of the message alone) is stale, so the reconciler re-embeds it. Until then the dense leg
-- does not return it (it reads only `ok` vectors) and the lexical leg still does: no index
-- mixes the two kinds of vector.
WITH s AS (
    SELECT tenant_id, user_id, persona_id, agent_id, session_id, message_id, sent_at,
           CASE WHEN coalesce(nullif(sender_name, ''),
                              substring(sender_id from '^[[:alpha:]]+(?:[ .''-][[:alpha:]]+)*$'))
                     IS NULL THEN text
                ELSE coalesce(nullif(sender_name, ''),
                              substring(sender_id from '^[[:alpha:]]+(?:[ .''-][[:alpha:]]+)*$'))
                     || ' said, "' || text || '"' END AS unit
    FROM messages
),
w AS (
    SELECT tenant_id, user_id, persona_id, agent_id, session_id, message_id,
           right(lag(unit) OVER o, 512) AS prev
    FROM s
    WINDOW o AS (PARTITION BY tenant_id, user_id, persona_id, agent_id, session_id
                 ORDER BY sent_at, message_id)
)
UPDATE messages m
SET embed_prev = w.prev,
    embedding_state = CASE WHEN m.embedding_state = 'ok' THEN 'stale' ELSE m.embedding_state END
FROM w
WHERE w.prev IS NOT NULL
  AND (m.tenant_id, m.user_id, m.persona_id, m.agent_id, m.session_id, m.message_id)
    = (w.tenant_id, w.user_id, w.persona_id, w.agent_id, w.session_id, w.message_id);
