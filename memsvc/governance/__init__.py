"""Memory governance.

Per-tenant policies for personal data, retention and TTL expiry, and trust (confidence decay).
"""
