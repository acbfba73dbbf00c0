-- Per-tenant governance settings; a tenant without a row uses the server's defaults.
CREATE TABLE tenant_settings (
    tenant_id     text PRIMARY KEY,
    -- PII kind -> action ("store", "redact", "reject"); kinds absent use the server default.
    pii_policy    jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- Time to live of stored messages, in seconds; NULL: the server default; 0: never expire.
    message_ttl_s bigint CHECK (message_ttl_s IS NULL OR message_ttl_s >= 0),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
