"""Memory governance: per-tenant policies for personal data and retention."""
