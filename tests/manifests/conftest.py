"""The live embedded portal of the SDK and CLI tests (tests/sdk/conftest.py), for `gpuportal apply`."""

from tests.sdk.conftest import cli, cli_env, live_portal  # noqa: F401 - fixtures
