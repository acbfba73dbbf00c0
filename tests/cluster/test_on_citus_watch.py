"""tests/test_watch.py again, on this session's Citus cluster
(tests/cluster/conftest.py gives every fixture the coordinator): the same tests, unchanged,
must hold there too. Their server polls every half second; test_citus_change_wakeups.py
shows the changes arrive by notification there, not by that poll."""

from tests.test_watch import *  # noqa: F403
