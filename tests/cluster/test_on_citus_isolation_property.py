"""tests/test_isolation_property.py again, on this session's Citus cluster
(tests/cluster/conftest.py gives every fixture the coordinator): the same tests, unchanged,
must hold there too."""

from tests.test_isolation_property import *  # noqa: F403
