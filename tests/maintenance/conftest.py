"""The live embedded portal and its command line (tests/sdk/conftest.py), for test_cli.py."""

from tests.sdk.conftest import cli, cli_env, live_portal  # noqa: F401 (fixtures, found here by pytest)
