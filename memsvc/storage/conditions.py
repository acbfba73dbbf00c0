"""The WHERE conditions every statement over the memory tiers shares ($1..$4 are ``Scope.key``)."""

# Exactly one scope: tenant, user, persona, agent.
EXACT_SCOPE = "tenant_id = $1 AND user_id = $2 AND persona_id = $3 AND agent_id = $4"

# Visible from a scope (facts): rows written in exactly that scope, plus rows of the same user
# that were explicitly shared across agents and/or personas.
VISIBLE = """
    tenant_id = $1 AND user_id = $2
    AND (persona_id = $3 OR shared_all_personas)
    AND (agent_id = $4 OR shared_all_agents)
"""


def not_expired(table: str = "", *, at: str = "now()") -> str:
    """Not expired at `at` (SQL): an expired row is never returned, even before the expiry
    task deletes it. `table` qualifies the column when the statement joins."""
    column = f"{table}.expires_at" if table else "expires_at"
    return f"({column} IS NULL OR {column} > {at})"


NOT_EXPIRED = not_expired()
# A fact's current version: not superseded or ended, and not expired.
CURRENT = f"invalid_at IS NULL AND {NOT_EXPIRED}"
