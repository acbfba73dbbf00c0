-- Trust over time and the core-memory limit.
-- Compaction demotes a core memory in place (same id, still current and searchable): these
-- columns say when, what it was before, and into which summary it was folded (if any).
ALTER TABLE memories ADD COLUMN demoted_at timestamptz;
ALTER TABLE memories ADD COLUMN demoted_role text NOT NULL DEFAULT '';
ALTER TABLE memories ADD COLUMN demoted_pinned boolean NOT NULL DEFAULT false;
ALTER TABLE memories ADD COLUMN demoted_into uuid;
