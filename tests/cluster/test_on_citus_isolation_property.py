"""tests/test_isolation_property.py again, on the Citus cluster of this session (tests/cluster/conftest.py
gives every fixture the coordinator): the same tests, unchanged, must hold there too."""

from tests.test_isolation_property import *  # noqa: F403
