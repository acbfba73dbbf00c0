"""Test and benchmark clusters built from the embedded servers: Citus (coordinator and workers)
and a valkey cluster. Only tests/ and bench/ use them; the product never imports tools/."""
