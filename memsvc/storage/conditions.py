"""The SQL fragment every exact-scope statement shares ($1..$4 are ``Scope.key``)."""

EXACT_SCOPE = "tenant_id = $1 AND user_id = $2 AND persona_id = $3 AND agent_id = $4"
