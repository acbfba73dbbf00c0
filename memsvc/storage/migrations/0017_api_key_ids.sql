-- API keys you can manage (issue 31): a public id to list and revoke a key by (derived from
-- its digest: "key_" and the digest's first 16 hex digits, 64 bits, never the key), and when
-- it was last used (stamped by the serving processes about once a minute, not per call).
ALTER TABLE api_keys ADD COLUMN key_id text;
ALTER TABLE api_keys ADD COLUMN last_used_at timestamptz;
UPDATE api_keys SET key_id = 'key_' || substr(encode(key_hash, 'hex'), 1, 16);
ALTER TABLE api_keys ALTER COLUMN key_id SET NOT NULL;
CREATE UNIQUE INDEX api_keys_key_id ON api_keys (key_id);
CREATE INDEX api_keys_label ON api_keys (label);
