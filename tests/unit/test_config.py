"""conf/config.json loading: the shipped file, schema and cross-key errors (key path + rule +
value, all at once), env overrides, relative paths, defaults and the EngineConfig mapping."""
from __future__ import annotations

import copy
import json
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import jsonschema
import pytest

from mindie_service.config import ServerSettings, ServiceConfig, check_files, load_config, load_schema
from mindie_service.engine.configs.engine_config import EngineConfig, LoraModuleSpec
from mindie_service.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "conf" / "config.json"
S = "ServerConfig"
D = "BackendConfig.ModelDeployConfig"
SC = "BackendConfig.ScheduleConfig"


def shipped() -> dict[str, Any]:
    return json.loads(SHIPPED.read_text())


def minimal(weight_path: str = "../models/m") -> dict[str, Any]:
    return {"BackendConfig": {"ModelDeployConfig": {"ModelConfig": [
        {"modelName": "m", "modelWeightPath": weight_path}]}}}


def write(tmp_path: Path, doc: dict[str, Any], name: str = "conf/config.json") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def load(tmp_path: Path, doc: dict[str, Any], env: dict[str, str] | None = None) -> ServiceConfig:
    return load_config(write(tmp_path, doc), env={} if env is None else env)


def problems_of(tmp_path: Path, doc: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, doc, env)
    return exc.value.problems


def server(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["ServerConfig"]


def deploy(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["BackendConfig"]["ModelDeployConfig"]


def sched(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["BackendConfig"]["ScheduleConfig"]


def model0(doc: dict[str, Any]) -> dict[str, Any]:
    return deploy(doc)["ModelConfig"][0]


# --- the shipped files --------------------------------------------------------------------------
def test_schema_ships_inside_the_package_not_in_conf() -> None:
    packaged = resources.files("mindie_service.config").joinpath("config.schema.json")
    assert packaged.is_file() and json.loads(packaged.read_text(encoding="utf-8")) == load_schema()
    assert not (REPO / "conf" / "config.schema.json").exists()  # one copy: conf/ holds what users edit


def test_schema_is_valid_draft_2020_12_and_documents_every_key() -> None:
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)

    def walk(s: dict[str, Any], path: str) -> None:
        for key, sub in s.get("properties", {}).items():
            assert sub.get("description"), f"{path}.{key} has no description"
            walk(sub, f"{path}.{key}")
        if isinstance(s.get("items"), dict):
            walk(s["items"], path + "[]")
    walk(schema, "")


def test_shipped_config_loads_with_cpu_values() -> None:
    cfg = load_config(SHIPPED, env={})
    assert cfg.path == SHIPPED
    m = cfg.models[0]
    assert (m.name, m.weight_path, m.mock) == ("SmolLM2-135M-Instruct", str(REPO / "models" / "SmolLM2-135M-Instruct"), False)
    s = cfg.server
    assert (s.ip_address, s.port, s.management_ip_address, s.management_port, s.metrics_port) == (
        "127.0.0.1", 1025, "127.0.0.1", 1026, 1027)
    assert s.https_enabled and s.tls.ca_files == (str(REPO / "security" / "ca" / "ca.pem"),)
    assert s.tls.cert == str(REPO / "security" / "certs" / "server.pem")
    assert s.tls.pk == str(REPO / "security" / "keys" / "server.key.pem")
    assert s.tls.pk_pwd is None and s.tls.crl_files == ()
    assert s.management_tls == s.tls == s.metrics_tls
    assert "tls" in {f.name for f in fields(ServerSettings)}  # a field like management_tls, no flat tls_*
    assert not any(f.name.startswith("tls_") for f in fields(ServerSettings))
    assert (s.stream_token_id_format, s.max_media_items, s.max_request_bytes) == ("list", 20, 40 * 1024 * 1024)
    assert (cfg.backend.max_seq_len, cfg.backend.max_input_token_len) == (2560, 2048)
    sc = cfg.schedule
    assert (sc.max_batch_size, sc.max_prefill_batch_size, sc.max_prefill_tokens, sc.max_iter_times,
            sc.cache_block_size) == (64, 16, 512, 512, 16)


# --- one bad value, one message naming key path, rule and value ---------------------------------
BAD: list[tuple[str, Callable[[dict[str, Any]], None], list[str]]] = [
    ("port 80", lambda d: server(d).update(port=80), [f"{S}.port", "[1024, 65535]", "got 80"]),
    ("maxBatchSize 0", lambda d: sched(d).update(maxBatchSize=0), [f"{SC}.maxBatchSize", "got 0"]),
    ("cacheBlockSize 256", lambda d: sched(d).update(cacheBlockSize=256),
     [f"{SC}.cacheBlockSize", "[1, 128]", "got 256"]),
    ("modelName with a space", lambda d: model0(d).update(modelName="my model"),
     [f"{D}.ModelConfig[0].modelName", "^[A-Za-z0-9._-]{1,256}$", '"my model"']),
    ("modelName too long", lambda d: model0(d).update(modelName="a" * 257), [f"{D}.ModelConfig[0].modelName"]),
    ("unknown key", lambda d: server(d).update(portt=1), [f"{S}.portt is not a known key", "'port'"]),
    ("unknown key in ModelConfig", lambda d: model0(d).update(weights="x"), [f"{D}.ModelConfig[0].weights"]),
    ("wrong type", lambda d: server(d).update(httpsEnabled="yes"), [f"{S}.httpsEnabled", "boolean", '"yes"']),
    ("maxLinkNum 5000", lambda d: server(d).update(maxLinkNum=5000), [f"{S}.maxLinkNum", "[1, 4096]", "5000"]),
    ("maxRequestLength 101", lambda d: server(d).update(maxRequestLength=101), [f"{S}.maxRequestLength", "101"]),
    ("maxStreamBufferBytes 4095", lambda d: server(d).update(maxStreamBufferBytes=4095),
     [f"{S}.maxStreamBufferBytes", "4096", "4095"]),
    ("tokenTimeout 0", lambda d: server(d).update(tokenTimeout=0), [f"{S}.tokenTimeout", "(0, 3600]", "got 0"]),
    ("bad ip", lambda d: server(d).update(ipAddress="localhost"), [f"{S}.ipAddress", "IPv4", '"localhost"']),
    ("streamTokenIdFormat", lambda d: server(d).update(streamTokenIdFormat="str"),
     [f"{S}.streamTokenIdFormat", '"list", "int"', '"str"']),
    ("npuMemSize 0", lambda d: model0(d).update(npuMemSize=0), [f"{D}.ModelConfig[0].npuMemSize", "-1", "got 0"]),
    ("no ModelConfig", lambda d: deploy(d).update(ModelConfig=[]), [f"{D}.ModelConfig", "at least 1"]),
    ("missing modelWeightPath", lambda d: model0(d).pop("modelWeightPath"),
     [f"{D}.ModelConfig[0].modelWeightPath is required"]),
    ("maxPrefillBatchSize > maxBatchSize", lambda d: sched(d).update(maxPrefillBatchSize=65),
     [f"{SC}.maxPrefillBatchSize", f"{SC}.maxBatchSize (64)", "got 65"]),
    ("maxIterTimes > maxSeqLen", lambda d: sched(d).update(maxIterTimes=3000),
     [f"{SC}.maxIterTimes", f"{D}.maxSeqLen (2560)", "got 3000"]),
    ("maxPreemptCount > maxBatchSize", lambda d: sched(d).update(maxPreemptCount=65),
     [f"{SC}.maxPreemptCount", "got 65"]),
    ("numKvBlocks too small", lambda d: sched(d).update(numKvBlocks=10), [f"{SC}.numKvBlocks", "160", "got 10"]),
    ("videoFrames > maxVideoFrames", lambda d: deploy(d).update(videoFrames=33), [f"{D}.videoFrames", "33"]),
    ("0.0.0.0", lambda d: server(d).update(ipAddress="0.0.0.0"),
     [f"{S}.ipAddress", "allowAllZeroIpListening", '"0.0.0.0"']),
    ("::", lambda d: server(d).update(managementIpAddress="::"), [f"{S}.managementIpAddress", '"::"']),
    ("worldSize vs npuDeviceIds", lambda d: model0(d).update(worldSize=2), [f"{D}.ModelConfig[0].worldSize"]),
    ("instances vs npuDeviceIds", lambda d: d["BackendConfig"].update(modelInstanceNumber=2),
     ["BackendConfig.npuDeviceIds", "modelInstanceNumber"]),
    ("duplicate LoRA names", lambda d: deploy(d).update(LoraModules=[{"name": "a", "path": "x"},
                                                                     {"name": "a", "path": "y"}]),
     [f"{D}.LoraModules[1].name", "unique", '"a"']),
    ("LoRA named like the model", lambda d: deploy(d).update(LoraModules=[{"name": "SmolLM2-135M-Instruct", "path": "x"}]),
     [f"{D}.LoraModules[0].name"]),
    ("unknown LoRA base", lambda d: deploy(d).update(LoraModules=[{"name": "a", "path": "x", "baseModelName": "b"}]),
     [f"{D}.LoraModules[0].baseModelName", '"b"']),
    ("more LoRAs than maxLoras", lambda d: deploy(d).update(maxLoras=0, LoraModules=[{"name": "a", "path": "x"}]),
     [f"{D}.maxLoras", "got 0"]),
    # Multi-node tensor parallelism is supported (issue 17); inter-node TLS is not (torch.distributed has none).
    ("multi-node with inter-node TLS", lambda d: d["BackendConfig"].update(multiNodesInferEnabled=True,
                                                                           interNodeTLSEnabled=True),
     ["BackendConfig.interNodeTLSEnabled", "false", "got true"]),
    ("cpuKernels not a boolean", lambda d: deploy(d).update(cpuKernels="yes"),
     [f"{D}.cpuKernels", "a boolean", '"yes"']),
    ("cudaGraphs not a boolean", lambda d: deploy(d).update(cudaGraphs=1),
     [f"{D}.cudaGraphs", "a boolean", "1"]),
    ("kernelCacheDir empty", lambda d: deploy(d).update(kernelCacheDir=""),
     [f"{D}.kernelCacheDir", "a non-empty string or null", 'got ""']),
]


@pytest.mark.parametrize("mutate,expected", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_one_bad_value_gives_one_message_naming_key_rule_and_value(
        tmp_path: Path, mutate: Callable[[dict[str, Any]], None], expected: list[str]) -> None:
    doc = shipped()
    mutate(doc)
    problems = problems_of(tmp_path, doc)
    assert len(problems) == 1, problems
    for text in expected:
        assert text in problems[0], (text, problems[0])


def test_all_zero_address_allowed_when_enabled(tmp_path: Path) -> None:
    doc = shipped()
    server(doc).update(ipAddress="0.0.0.0", managementIpAddress="::", allowAllZeroIpListening=True)
    cfg = load(tmp_path, doc)
    assert (cfg.server.ip_address, cfg.server.management_ip_address) == ("0.0.0.0", "::")


def test_several_errors_are_all_reported_at_once(tmp_path: Path) -> None:
    doc = shipped()
    server(doc)["port"] = 80
    server(doc)["colour"] = "blue"
    sched(doc)["cacheBlockSize"] = 256
    model0(doc)["modelName"] = "my model"
    sched(doc)["maxPrefillBatchSize"] = 100  # cross-key: > maxBatchSize 64
    problems = problems_of(tmp_path, doc)
    assert len(problems) == 5, problems
    for key in (f"{S}.port", f"{S}.colour", f"{SC}.cacheBlockSize", "modelName", f"{SC}.maxPrefillBatchSize"):
        assert any(key in p for p in problems), key
    assert all(str(tmp_path) in p for p in problems)


def test_prefill_token_budget_below_max_input_len_loads(tmp_path: Path) -> None:
    # Chunked prefill: maxPrefillTokens is one step's budget, a longer prompt spans several steps.
    doc = shipped()
    sched(doc).update(maxPrefillTokens=256)
    cfg = load(tmp_path, doc)
    e = cfg.engine_config()
    assert (e.max_prefill_tokens, e.effective_max_input_len) == (256, 2048)
    e.validate()
    EngineConfig(model="x", max_prefill_tokens=1, max_input_token_len=2048).validate()


@pytest.mark.parametrize("overrides,message", [
    ({"max_prefill_batch_size": 300}, "Parameter max_prefill_batch_size must be <= max_batch_size (200), got 300"),
    ({"max_iter_times": 3000}, "Parameter max_iter_times must be <= max_seq_len (2560), got 3000"),
    ({"max_preempt_count": 201}, "Parameter max_preempt_count must be <= max_batch_size (200), got 201"),
    ({"video_frames": 33}, "Parameter video_frames must be <= max_video_frames (32), got 33"),
])
def test_offline_api_words_the_shared_rules_with_field_names(overrides: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError) as exc:
        EngineConfig(model="x", **overrides).validate()
    assert str(exc.value) == message


def test_config_words_the_shared_rules_with_key_paths(tmp_path: Path) -> None:
    doc = shipped()
    sched(doc).update(maxPreemptCount=65, maxPrefillBatchSize=65)
    problems = [p.split(": ", 1)[1] for p in problems_of(tmp_path, doc)]
    assert sorted(problems) == [f"{SC}.maxPreemptCount must be <= {SC}.maxBatchSize (64), got 65",
                                f"{SC}.maxPrefillBatchSize must be <= {SC}.maxBatchSize (64), got 65"]


def test_cross_key_check_skipped_when_its_keys_already_failed(tmp_path: Path) -> None:
    doc = shipped()
    sched(doc)["maxBatchSize"] = 0  # schema error; maxPrefillBatchSize 16 > 0 is not reported twice
    assert len(problems_of(tmp_path, doc)) == 1


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "ServerConfig": {\n    "port": 1025,\n  }\n}\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path, env={})
    assert f"{path}:4:" in str(exc.value) and "invalid JSON" in str(exc.value)


def test_duplicate_key_and_missing_file_are_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"Version": "1", "Version": "2"}')
    with pytest.raises(ConfigError, match="'Version' appears twice"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.json", env={})


# --- env overrides ------------------------------------------------------------------------------
def test_env_overrides_ip_addresses(tmp_path: Path) -> None:
    doc = shipped()
    del server(doc)["managementIpAddress"]
    cfg = load(tmp_path, doc, env={"MIES_CONTAINER_IP": "10.1.2.3"})
    assert (cfg.server.ip_address, cfg.server.management_ip_address) == ("10.1.2.3", "10.1.2.3")
    cfg = load(tmp_path, doc, env={"MIES_CONTAINER_IP": "10.1.2.3", "MIES_CONTAINER_MANAGEMENT_IP": "::1"})
    assert (cfg.server.ip_address, cfg.server.management_ip_address) == ("10.1.2.3", "::1")
    assert cfg.raw == doc  # raw is the file as read


def test_env_is_read_at_load_time_from_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, shipped())
    monkeypatch.setenv("MIES_CONTAINER_MANAGEMENT_IP", "127.0.0.9")
    assert load_config(path).server.management_ip_address == "127.0.0.9"
    monkeypatch.delenv("MIES_CONTAINER_MANAGEMENT_IP")
    assert load_config(path).server.management_ip_address == "127.0.0.1"


def test_bad_env_value_is_reported_with_the_variable(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, shipped(), env={"MIES_CONTAINER_IP": "not-an-ip"})
    assert len(problems) == 1 and "MIES_CONTAINER_IP" in problems[0] and '"not-an-ip"' in problems[0]


def test_management_address_defaults_to_ip_address(tmp_path: Path) -> None:
    doc = minimal()
    doc["ServerConfig"] = {"ipAddress": "127.0.0.5"}
    assert load(tmp_path, doc).server.management_ip_address == "127.0.0.5"


# --- paths --------------------------------------------------------------------------------------
def test_relative_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    doc = minimal("../models/m")
    doc["ServerConfig"] = {"tlsCaPath": "../sec/ca", "tlsCaFile": ["a.pem", "/abs/b.pem"], "tlsCert": "c.pem",
                           "tlsPk": "/abs/k.pem", "tlsPkPwd": "pw.txt", "tlsCrlPath": "crl",
                           "tlsCrlFiles": ["r.pem"], "managementTlsCert": "mgmt.pem",
                           "allowedLocalMediaPaths": ["../media", "/srv/media"]}
    deploy(doc)["LoraModules"] = [{"name": "ad", "path": "../adapters/ad"}]
    cfg = load(tmp_path, doc)  # written to tmp_path/conf/config.json
    conf = tmp_path / "conf"
    s = cfg.server
    assert cfg.models[0].weight_path == str(tmp_path / "models" / "m")
    assert s.tls.ca_files == (str(tmp_path / "sec" / "ca" / "a.pem"), "/abs/b.pem")
    assert (s.tls.cert, s.tls.pk, s.tls.pk_pwd) == (str(conf / "c.pem"), "/abs/k.pem", str(conf / "pw.txt"))
    assert s.tls.crl_files == (str(conf / "crl" / "r.pem"),)
    assert s.management_tls.cert == str(conf / "mgmt.pem") and s.management_tls.pk == "/abs/k.pem"
    assert s.metrics_tls.cert == str(conf / "c.pem")
    assert s.allowed_local_media_paths == (str(tmp_path / "media"), "/srv/media")
    assert cfg.lora_modules == (LoraModuleSpec("ad", str(tmp_path / "adapters" / "ad"), "m"),)


def test_check_files_names_every_missing_file(tmp_path: Path) -> None:
    doc = shipped()
    cfg = load(tmp_path, doc)
    with pytest.raises(ConfigError) as exc:
        check_files(cfg)
    text = str(exc.value)
    for key in ("modelWeightPath", f"{S}.tlsCaFile", f"{S}.tlsCert", f"{S}.tlsPk"):
        assert key in text
    (tmp_path / "models" / "SmolLM2-135M-Instruct").mkdir(parents=True)
    (tmp_path / "models" / "SmolLM2-135M-Instruct" / "config.json").write_text(json.dumps({"torch_dtype": "float32",
                                                                             "vocab_size": 10}))
    for rel in ("security/ca/ca.pem", "security/certs/server.pem", "security/keys/server.key.pem"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    check_files(cfg)
    server(doc)["httpsEnabled"] = False
    for rel in ("security/ca/ca.pem",):
        (tmp_path / rel).unlink()
    check_files(load(tmp_path, doc))  # TLS files are not needed without HTTPS


# --- defaults and the engine mapping ------------------------------------------------------------
def test_minimal_config_takes_mindie_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path, minimal())
    s = cfg.server
    assert (s.ip_address, s.port, s.management_ip_address, s.management_port, s.metrics_port) == (
        "127.0.0.1", 1025, "127.0.0.1", 1026, 1027)
    assert (s.max_link_num, s.https_enabled, s.token_timeout, s.e2e_timeout, s.max_request_length) == (
        1000, True, 600.0, 600.0, 40)
    assert s.max_stream_buffer_bytes == 1 << 20  # ServerConfig.maxStreamBufferBytes: 1 MB
    assert s.tls.ca_files == (str(tmp_path / "conf" / "security" / "ca" / "ca.pem"),)
    assert (cfg.schedule.cache_block_size, cfg.schedule.max_batch_size, cfg.schedule.max_prefill_batch_size) == (
        128, 200, 50)
    assert cfg.backend.npu_device_ids == ((0,),) and cfg.models[0].npu_mem_size_gb == -1


def test_schema_defaults_agree_with_engine_defaults(tmp_path: Path) -> None:
    cfg = load(tmp_path, minimal())
    assert cfg.engine_config() == EngineConfig(model=cfg.models[0].weight_path, model_name="m")


def test_engine_config_mapping(tmp_path: Path) -> None:
    doc = shipped()
    deploy(doc).update(numThreads=2, truncation=True, cpuKernels=False, kernelCacheDir="../cache/kernels",
                       cudaGraphs=False)
    sched(doc).update(numKvBlocks=500, maxPreemptCount=3, maxQueueDelayMicroseconds=700, enablePrefixCaching=False)
    model0(doc).update(trustRemoteCode=True)
    second = {**model0(doc), "modelName": "other", "modelWeightPath": "/w/other", "npuMemSize": 7}
    deploy(doc)["ModelConfig"].append(second)
    deploy(doc)["LoraModules"] = [{"name": "a1", "path": "/ad/a1"},
                                  {"name": "a2", "path": "/ad/a2", "baseModelName": "other"}]
    cfg = load(tmp_path, doc)
    e = cfg.engine_config()
    assert (e.model, e.model_name, e.trust_remote_code) == (str(tmp_path / "models" / "SmolLM2-135M-Instruct"),
                                                            "SmolLM2-135M-Instruct", True)
    assert (e.max_seq_len, e.max_input_token_len, e.truncation, e.cache_block_size) == (2560, 2048, True, 16)
    assert (e.max_batch_size, e.max_prefill_batch_size, e.max_prefill_tokens, e.max_iter_times) == (64, 16, 512, 512)
    assert (e.max_preempt_count, e.max_queue_delay_microseconds, e.num_kv_blocks) == (3, 700, 500)
    assert (e.kv_cache_memory_gb, e.enable_prefix_caching, e.num_threads) == (2.0, False, 2)
    assert (e.max_loras, e.max_lora_rank, e.video_frames, e.max_video_frames) == (4, 64, 8, 32)
    assert (e.cpu_kernels, e.kernel_cache_dir, e.cuda_graphs) == (False, str(tmp_path / "cache" / "kernels"), False)
    assert e.lora_modules == (LoraModuleSpec("a1", "/ad/a1", "SmolLM2-135M-Instruct"),)
    e.validate()
    e2 = cfg.engine_config(1)
    assert (e2.model, e2.model_name, e2.kv_cache_memory_gb) == ("/w/other", "other", 7.0)
    assert e2.lora_modules == (LoraModuleSpec("a2", "/ad/a2", "other"),)
    assert cfg.model("other") is cfg.models[1]


def test_standard_mock_sets_the_mock_flag(tmp_path: Path) -> None:
    doc = shipped()
    model0(doc)["modelInstanceType"] = "StandardMock"
    assert load(tmp_path, doc).models[0].mock


def test_shared_address_and_port_is_one_listener(tmp_path: Path) -> None:
    doc = copy.deepcopy(shipped())
    server(doc).update(managementPort=1025)
    assert load(tmp_path, doc).server.listeners() == {("127.0.0.1", 1025): ("business", "management"),
                                                      ("127.0.0.1", 1027): ("metrics",)}
