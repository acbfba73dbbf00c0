-- last_referenced_at moves to its own narrow table. Reads set it all the time, and an UPDATE
-- of a memories row rewrites the whole wide row (its vector, its generated tsvector) and adds
-- an entry to every index, the HNSW graph included: at 50 reads a second that cost more CPU
-- than the reads themselves. Here an update touches a small row, in place (HOT: the timestamp
-- is not indexed and the fill factor leaves room on the page).
--
-- No foreign key: its check would lock (and so write to) the memories row of every reference.
-- A statement trigger removes the references of deleted memories instead, whichever path
-- deletes them (Forget, erasure, expiry, session end).
CREATE TABLE memory_references (
    tenant_id          text NOT NULL,
    user_id            text NOT NULL,
    memory_id          uuid NOT NULL,
    last_referenced_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, user_id, memory_id)
) WITH (fillfactor = 70);
INSERT INTO memory_references (tenant_id, user_id, memory_id, last_referenced_at)
    SELECT tenant_id, user_id, memory_id, last_referenced_at FROM memories
    WHERE last_referenced_at IS NOT NULL;
ALTER TABLE memories DROP COLUMN last_referenced_at;

CREATE FUNCTION memsvc_forget_references() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_references r USING gone g
    WHERE r.tenant_id = g.tenant_id AND r.user_id = g.user_id AND r.memory_id = g.memory_id;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_forget_references AFTER DELETE ON memories
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION memsvc_forget_references();
