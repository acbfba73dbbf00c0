-- Core blocks: the persona block and the human block of each exact scope, with every
-- revision kept. The current text of a block is its row with replaced_at IS NULL; a write
-- sets replaced_at on that row and inserts the next revision (1, 2, ...), in one transaction
-- under the user's advisory lock. The human block's limit also covers the scope's core facts
-- (memories pinned or of the core role): compaction reads the current text's length.
CREATE TABLE core_block_revisions (
    tenant_id   text NOT NULL,
    user_id     text NOT NULL,
    persona_id  text NOT NULL DEFAULT '',
    agent_id    text NOT NULL DEFAULT '',
    block       text NOT NULL CHECK (block IN ('persona', 'human')),
    revision    integer NOT NULL CHECK (revision >= 1),
    text        text NOT NULL,
    -- How it was written: 'replace' or 'append' (imports keep the original's).
    mode        text NOT NULL CHECK (mode IN ('replace', 'append')),
    -- Who wrote it: 'application' (default), 'agent' (self-editing), 'operator', ...
    author      text NOT NULL,
    reason      text NOT NULL DEFAULT '',
    recorded_at timestamptz NOT NULL DEFAULT now(),
    -- When the next revision replaced it; NULL for the current one.
    replaced_at timestamptz,
    PRIMARY KEY (tenant_id, user_id, persona_id, agent_id, block, revision)
);
-- At most one current revision per block.
CREATE UNIQUE INDEX core_block_revisions_current
    ON core_block_revisions (tenant_id, user_id, persona_id, agent_id, block)
    WHERE replaced_at IS NULL;

-- Per-tenant limits of the blocks, in characters; NULL: the server default
-- (MEMSVC_HUMAN_BLOCK_MAX_CHARS / MEMSVC_PERSONA_BLOCK_MAX_CHARS); 0: no limit.
ALTER TABLE tenant_settings
    ADD COLUMN human_block_max_chars integer CHECK (human_block_max_chars >= 0),
    ADD COLUMN persona_block_max_chars integer CHECK (persona_block_max_chars >= 0);
