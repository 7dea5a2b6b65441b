"""A MindIE Server `config.json` read as serve options.

MindIE documents four sections (ServerConfig, BackendConfig with ModelDeployConfig / ModelConfig and
ScheduleConfig, LogConfig). `options._read_config` flattens them to their leaves; here each MindIE
leaf either maps to one of our options (`MAPPED`: the option's name and how the value converts) or
has no meaning on this server (`IGNORED`: NPU ids, management / metrics / inter-node planes, KMC
key stores, Ascend scheduling knobs) and is named in one warning. A key in neither stays an error.
Keys that already are option names or `EngineArgs` keys (maxSeqLen, maxBatchSize, ...) never get here.
worldSize / modelInstanceNumber count NPU cards and instances laid out by npuDeviceIds: ignored, not
turned into CPU ranks or replicas (--tensor-parallel-size / --data-parallel-size say that here).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("inflight.server")

_LOG_LEVELS = {"verbose": "debug", "debug": "debug", "info": "info", "warning": "warning", "error": "error", "none": "error"}


def _log_level(value: Any) -> str:
    level = _LOG_LEVELS.get(str(value).lower())
    if level is None:
        raise ValueError(f"logLevel: {value!r} is not one of Verbose, Info, Warning, Error, None")
    return level


# MindIE key -> (our option, value converter); `engine.` options go to EngineArgs
MAPPED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "maxLinkNum": ("max_connections", int),  # concurrent connections (MindIE: 1000 by default)
    "logLevel": ("log_level", _log_level),
}

# MindIE keys with no meaning here (each named in the start-up warning)
IGNORED = frozenset(
    """
    Version EnableDynamicAdjustTimeoutConfig logFileSize logFileNum logPath
    managementIpAddress managementPort metricsPort allowAllZeroIpListening inferMode openAiSupport
    tokenTimeout e2eTimeout distDPServerEnabled maxRequestLength
    tlsPkPwd tlsCrl tlsCrlPath tlsCrlFiles kmcKsfMaster kmcKsfStandby
    managementTlsCaFile managementTlsCert managementTlsPk managementTlsPkPwd managementTlsCrl
    managementTlsCrlPath managementTlsCrlFiles metricsTlsCaFile metricsTlsCert metricsTlsPk metricsTlsPkPwd
    metricsTlsCrlPath metricsTlsCrlFiles
    interCommTLSEnabled interCommPort interCommTlsCaPath interCommTlsCaFile interCommTlsCaFiles interCommTlsCert
    interCommPk interCommPkPwd interCommTlsCrl interCommTlsCrlPath interCommTlsCrlFiles
    backendName npuDeviceIds tokenizerProcessNumber multiNodesInferEnabled multiNodesInferPort
    interNodeTLSEnabled interNodeTlsCaPath interNodeTlsCaFiles interNodeTlsCert interNodeTlsPk interNodeTlsPkPwd
    interNodeTlsCrlPath interNodeTlsCrlFiles interNodeKmcKsfMaster interNodeKmcKsfStandby
    worldSize modelInstanceNumber truncation modelInstanceType backendType trustRemoteCode npuMemSize cpuMemSize async_scheduler_wait_time
    templateType templateName maxPrefillBatchSize prefillTimeMsPerReq prefillPolicyType decodeTimeMsPerReq
    decodePolicyType maxPreemptCount supportSelectBatch maxQueueDelayMicroseconds bufferResponseEnabled
    decodeExpectedTime prefillExpectedTime
    """.split()
)

# HTTPS: httpsEnabled true turns these into ssl_certfile / ssl_keyfile / ssl_ca_certs (MindIE's are
# relative to its install directory; here relative to the config file's directory)
_TLS = frozenset({"httpsEnabled", "tlsCaPath", "tlsCaFile", "tlsCert", "tlsPk"})


def model_entries(value: Any) -> dict[str, Any]:
    """ModelDeployConfig.ModelConfig is a list of models: one is served here."""
    if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], dict):
        raise ValueError("ModelConfig: this server serves one model: a list of one object")
    return value[0]


def read(leaves: dict[str, Any], base: Path) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The MindIE leaves of a config file -> (engine values, server values, unknown keys); logs the
    ignored ones. `leaves` holds only keys that are not our options already."""
    engine: dict[str, Any] = {}
    server: dict[str, Any] = {}
    ignored, unknown = [], []
    for key, value in leaves.items():
        if key in MAPPED:
            name, convert = MAPPED[key]
            target = engine if name.startswith("engine.") else server
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ValueError(f"{key}: {value!r} is not a valid value")
            try:
                target[name.removeprefix("engine.")] = convert(value)
            except ValueError as e:
                raise ValueError(e.args[0] if str(e).startswith(key) else f"{key}: {value!r} is not a valid value") from e
        elif key in IGNORED:
            if key != "Version":
                ignored.append(key)
        elif key not in _TLS:
            unknown.append(key)
    if leaves.get("httpsEnabled") is True:
        server |= _tls(leaves, base)
    else:
        ignored += sorted(k for k in _TLS & leaves.keys() if k != "httpsEnabled")
    if ignored:
        logger.warning("config: MindIE keys with no meaning on this server, ignored: %s", ", ".join(ignored))
    return engine, server, unknown


def _tls(leaves: dict[str, Any], base: Path) -> dict[str, Any]:
    def path(*parts: str) -> str:
        return str(base.joinpath(*parts))

    if not (isinstance(leaves.get("tlsCert"), str) and isinstance(leaves.get("tlsPk"), str)):
        raise ValueError("httpsEnabled: needs tlsCert and tlsPk (PEM files)")
    out = {"ssl_certfile": path(leaves["tlsCert"]), "ssl_keyfile": path(leaves["tlsPk"])}
    ca = leaves.get("tlsCaFile")
    if ca:  # MindIE's HTTPS verifies client certificates against these CAs (mutual TLS)
        files = ca if isinstance(ca, list) else [ca]
        if len(files) != 1:
            raise ValueError("tlsCaFile: one CA bundle file is read here")
        out["ssl_ca_certs"] = path(str(leaves.get("tlsCaPath") or ""), files[0])
    return out
