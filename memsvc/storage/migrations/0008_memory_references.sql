-- last_referenced_at moves to its own narrow table. Reads set it all the time, and an UPDATE
-- of a memories row rewrites the whole wide row (its vector, its generated tsvector) and adds
-- an entry to every index, the HNSW graph included: at 50 reads a second that cost more CPU
-- than the reads themselves. Here an update touches a small row, in place (HOT: the timestamp
-- is not indexed and the fill factor leaves room on the page).
CREATE TABLE memory_references (
    tenant_id          text NOT NULL,
    user_id            text NOT NULL,
    memory_id          uuid NOT NULL,
    last_referenced_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, user_id, memory_id),
    FOREIGN KEY (tenant_id, user_id, memory_id)
        REFERENCES memories (tenant_id, user_id, memory_id) ON DELETE CASCADE
) WITH (fillfactor = 70);
INSERT INTO memory_references (tenant_id, user_id, memory_id, last_referenced_at)
    SELECT tenant_id, user_id, memory_id, last_referenced_at FROM memories
    WHERE last_referenced_at IS NOT NULL;
ALTER TABLE memories DROP COLUMN last_referenced_at;
