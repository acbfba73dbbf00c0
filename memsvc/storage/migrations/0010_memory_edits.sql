-- UpdateMemory: in-place changes of one memory version (pinned, category, role, sharing,
-- retention, confidence), kept as its history (GetMemoryHistory `edits`, ExportMemories).
ALTER TABLE memories ADD COLUMN updated_at timestamptz;

CREATE TABLE memory_edits (
    tenant_id  text NOT NULL,
    user_id    text NOT NULL,
    edit_id    uuid NOT NULL,
    -- The version that was changed; its edits go with it (Forget, erasure, expiry).
    memory_id  uuid NOT NULL,
    edited_at  timestamptz NOT NULL DEFAULT now(),
    -- The update_mask paths whose value changed, in mask order.
    fields     text[] NOT NULL,
    -- Each changed field's value before and after, as text (MemoryEdit.before / after).
    before     jsonb NOT NULL,
    after      jsonb NOT NULL,
    reason     text NOT NULL DEFAULT '',
    PRIMARY KEY (tenant_id, user_id, edit_id),
    FOREIGN KEY (tenant_id, user_id, memory_id)
        REFERENCES memories (tenant_id, user_id, memory_id) ON DELETE CASCADE
);
CREATE INDEX memory_edits_memory ON memory_edits (tenant_id, user_id, memory_id);
