"""Flow settings: the temporary server is quieted, a configured server is left alone."""

from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    PREFECT_LOGGING_TO_API_ENABLED,
    PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED,
    temporary_settings,
)

from thresher.flows.runtime import flow_settings


def test_without_a_server_the_temporary_one_records_only_what_someone_can_see():
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert PREFECT_LOGGING_TO_API_ENABLED.value() is True
        with flow_settings():
            assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None
            assert PREFECT_LOGGING_TO_API_ENABLED.value() is False
            assert PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED.value() is False
        assert PREFECT_LOGGING_TO_API_ENABLED.value() is True  # restored on the way out
        with flow_settings():  # the second time from the cache: the same settings
            assert PREFECT_LOGGING_TO_API_ENABLED.value() is False


def test_with_a_server_prefect_settings_apply_unchanged():
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        with flow_settings():
            assert PREFECT_LOGGING_TO_API_ENABLED.value() is True
            assert PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED.value() is True
