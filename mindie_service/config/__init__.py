"""Load and validate conf/config.json (MindIE's layout) into frozen dataclasses.

Every default lives in one place: the ``default`` fields of the JSON Schema shipped in this
package (``config.schema.json``). One ``ConfigError`` carries one message per problem, each
naming the key path (``BackendConfig.ScheduleConfig.maxBatchSize``), the rule and the value.
Files the config names are checked separately by ``check_files(config)`` (after ``serve --prepare``).

Modules: ``settings`` (the dataclasses), ``loading`` (file, env, defaults, building),
``schema`` (the packaged schema), ``messages`` (wording), ``rules`` (cross-key checks),
``files`` (the files a config names).
"""
from __future__ import annotations

from mindie_service.config.files import check_files
from mindie_service.config.loading import ENV_IP, ENV_MANAGEMENT_IP, load_config
from mindie_service.config.schema import load_schema
from mindie_service.config.settings import (STANDARD_MOCK, BackendSettings, LogSettings, ModelSettings,
                                            ScheduleSettings, ServerSettings, ServiceConfig, TlsSettings)

__all__ = [
    "ENV_IP", "ENV_MANAGEMENT_IP", "STANDARD_MOCK", "BackendSettings", "LogSettings", "ModelSettings",
    "ScheduleSettings", "ServerSettings", "ServiceConfig", "TlsSettings", "check_files", "load_config",
    "load_schema",
]
