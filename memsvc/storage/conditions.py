"""The WHERE conditions every statement over the memory tiers shares ($1..$4 are ``Scope.key``)."""

# Exactly one scope: tenant, user, persona, agent. Every write, Correct and Forget act only
# on rows of the caller's exact scope: sharing grants reads, never changes by others.
EXACT_SCOPE = "tenant_id = $1 AND user_id = $2 AND persona_id = $3 AND agent_id = $4"


def visible(table: str = "") -> str:
    """Visible from a scope (facts; SQL): rows written in exactly that scope, plus rows of the
    same user explicitly shared across agents and/or personas. all_personas crosses persona
    scopes only: the human's own scope (persona_id '') and the persona scopes never see each
    other, whatever the sharing. `table` qualifies the columns when the statement joins."""
    p = f"{table}." if table else ""
    return f"""
    {p}tenant_id = $1 AND {p}user_id = $2
    AND ({p}persona_id = $3 OR ({p}shared_all_personas AND {p}persona_id <> '' AND $3 <> ''))
    AND ({p}agent_id = $4 OR {p}shared_all_agents)
"""


VISIBLE = visible()


def not_expired(table: str = "", *, at: str = "now()") -> str:
    """Not expired at `at` (SQL): an expired row is never returned, even before the expiry
    task deletes it. `table` qualifies the column when the statement joins."""
    column = f"{table}.expires_at" if table else "expires_at"
    return f"({column} IS NULL OR {column} > {at})"


NOT_EXPIRED = not_expired()
# A fact's current version: not superseded or ended, and not expired.
CURRENT = f"invalid_at IS NULL AND {NOT_EXPIRED}"
