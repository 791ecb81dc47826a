"""The model catalog: every model the service knows (config.json's ModelConfig entries and the folders of
ModelDeployConfig.modelsDir), its state, and its engine while it runs (each model its own EngineClient).

States: not_downloaded -> downloading -> downloaded -> starting -> running -> stopping -> stopped; a start
that fails leaves "failed" (``error`` says why), from which the model can be started again.
Start, stop and download return at once; the work runs in the background and clients poll the model."""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from mindie_service.catalog.checkpoint_kind import check_folder, declared_kind, detect
from mindie_service.catalog.entry import CatalogEntry
from mindie_service.catalog.fit_estimate import estimate, loaded_estimate
from mindie_service.catalog.memory_meter import LoadMeter
from npu_ops.memory import trim_heap
from mindie_service.catalog.model_json import ModelRecord, check_model_id, read_model_json
from mindie_service.catalog.shared_files import first_user
from mindie_service.engine.client import EngineClient
from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.fleet.instances import build_instances, instance_configs
from mindie_service.errors import ConflictError, ModelNotFoundError, UnhealthyError, ValidationError
from mindie_service.netguard import FetchPolicy
from mindie_service.catalog.generation_defaults import generation_defaults
from mindie_service.params.defaults import RequestDefaults

logger = logging.getLogger(__name__)

Build = Callable[[EngineConfig, bool], EngineClient]  # (config, mock) -> engine (blocking: loads weights)
DRAIN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Target:
    """What a request's ``model`` names: a running engine, and the adapter on it (None: the base model)."""

    entry: CatalogEntry
    engine: EngineClient
    adapter_id: str | None
    defaults: RequestDefaults


def _float_bytes(dtype: str) -> int:
    """Bytes per weight value once loaded: 2 for a half dtype, else 4 (float32, and "auto" on the CPU)."""
    return 2 if dtype in ("float16", "bfloat16") else 4


class Catalog:
    def __init__(self, config: Any, models_dir: Path, build: Build | None,
                 on_default: Callable[[EngineClient | None], None] = lambda e: None,
                 warm_up: Callable[[EngineClient], Awaitable[None]] | None = None) -> None:
        self.config = config
        self.models_dir = models_dir
        self.build = build
        self.on_default = on_default  # the default model (ModelConfig[0]) got or lost its engine
        self.warm_up = warm_up
        self.entries: dict[str, CatalogEntry] = {}
        self._lock = threading.Lock()  # resolve runs in the tokenizer pool, stop on the IO loop
        self.tasks: set[asyncio.Task[Any]] = set()
        self.on_release: Callable[[CatalogEntry], None] = lambda e: None  # a model's last hold ended (residency)
        for i, m in enumerate(config.models):
            folder = Path(m.weight_path)
            rec = read_model_json(folder, m.name) or ModelRecord(id=m.name, name=m.name)
            rec.id = m.name
            self.entries[m.name] = CatalogEntry(m.name, folder, rec, config_index=i, mock=m.mock,
                                                state="stopped",
                                                defaults=generation_defaults(m.generation_config, folder))
        self.scan()

    @property
    def default_id(self) -> str:
        return self.config.models[0].name

    # -- folders ---------------------------------------------------------------------------------
    def folder_of(self, model_id: str) -> Path:
        """modelsDir/{id}, checked to stay inside modelsDir."""
        check_model_id(model_id)
        root = self.models_dir.resolve()
        p = (root / model_id).resolve()
        if p.parent != root:
            raise ValidationError(f"Parameter model id must name a folder inside the catalog, got {model_id!r}")
        return p

    def scan(self) -> None:
        """Pick up folders added under modelsDir (a folder with config.json, one with a .gguf file, or one with a
        model.json)."""
        if not self.models_dir.is_dir():
            return
        for d in sorted(self.models_dir.iterdir()):
            if d.name.startswith(".") or not d.is_dir() or d.is_symlink() or d.name in self.entries:
                continue
            try:
                check_model_id(d.name)
            except ValidationError:
                continue
            rec = read_model_json(d, d.name)
            kind = detect(d)
            has_ckpt = kind is not None
            if rec is None and not has_ckpt:
                continue
            rec = rec or ModelRecord(id=d.name, name=d.name, format=kind or "")
            rec.id = d.name
            self.entries[d.name] = CatalogEntry(d.name, d, rec, state="downloaded" if has_ckpt else "not_downloaded")

    def get(self, model_id: str) -> CatalogEntry:
        self.scan()
        e = self.entries.get(model_id)
        if e is None:
            raise ModelNotFoundError(f"The model `{model_id}` does not exist (GET /v1/models lists them)")
        return e

    # -- requests --------------------------------------------------------------------------------
    def adapters(self, e: CatalogEntry) -> list[dict[str, Any]]:
        return e.engine.list_adapters() if e.engine is not None and e.state == "running" else []

    def resolve(self, name: str) -> Target:
        """The running model (or the adapter of a running model) ``name`` names, held until ``release``:
        404 unknown, 503 not running (stopping included: a stop lets held requests finish, takes no new ones)."""
        with self._lock:
            t = self._resolve(name)
            t.entry.active += 1
            return t

    def hold_lock(self) -> threading.Lock:
        """The lock ``resolve`` takes: a state change under it is seen by every later request."""
        return self._lock

    def release(self, target: Target) -> None:
        with self._lock:
            target.entry.active -= 1
            if target.entry.active == 0:
                self.on_release(target.entry)

    def _resolve(self, name: str) -> Target:
        e = self.entries.get(name)
        adapter = None
        if e is None:
            for cand in self.entries.values():
                if cand.engine is not None and cand.state == "running" and name in cand.engine.adapter_names():
                    e, adapter = cand, name
                    break
        if e is None:
            raise ModelNotFoundError(f"The model `{name}` does not exist (GET /v1/models lists them)")
        if e.state == "starting":
            raise UnhealthyError(e.loading_message())
        if e.state != "running" or e.engine is None:
            raise UnhealthyError(f"the model {name} is not running (state: {e.state}; PUT /v1/models/{e.id}/start)")
        if not e.engine.healthy():
            raise UnhealthyError(f"the engine of model {e.id} is not running")
        return Target(e, e.engine, adapter, e.record.request_defaults().over(e.defaults))

    # -- lifecycle -------------------------------------------------------------------------------
    def engine_config(self, e: CatalogEntry) -> EngineConfig:
        base = self.config.engine_config(e.config_index or 0)
        cfg = base if e.config_index is not None else dataclasses.replace(
            base, model=str(e.folder), model_name=e.id, lora_modules=(), task="auto", pooling=())
        if e.record.task:  # model.json's task: an embedding or rerank model
            cfg = dataclasses.replace(cfg, task=e.record.task)
        cap = e.record.ctx_len()
        if cap is not None and cap < cfg.max_seq_len:  # model.json's ctx_len caps the context, never raises it
            cfg = dataclasses.replace(cfg, max_seq_len=cap, max_input_token_len=min(cfg.max_input_token_len, cap - 1))
        return cfg

    def instance_configs(self, e: CatalogEntry, cfg: EngineConfig) -> list[EngineConfig]:
        """A ModelConfig entry runs BackendConfig.modelInstanceNumber instances (each its device group and
        share of the cores, ``cfg``'s context cap); a model of the catalog's folder runs one."""
        n = getattr(getattr(self.config, "backend", None), "model_instance_number", 1)
        if e.config_index is None or n <= 1:
            return [cfg]
        return [dataclasses.replace(ec, max_seq_len=cfg.max_seq_len, max_input_token_len=cfg.max_input_token_len)
                for ec in instance_configs(self.config, e.config_index)]

    def check_fits(self, e: CatalogEntry, cfg: EngineConfig) -> None:
        """Refuse a start that would not fit the memory left (weights + a minimum KV pool)."""
        if e.mock:
            return
        from npu_ops.platform import memory_info  # noqa: PLC0415 (torch only when a model starts)
        import torch

        world = self.config.models[e.config_index].world_size if e.config_index is not None else 1
        try:
            est = estimate(e.folder, cfg.max_seq_len, world_size=world, float_bytes=_float_bytes(cfg.dtype))
        except (ValidationError, ValueError, OSError) as ex:  # unreadable: the load says so, as its load_error
            logger.warning("model %s: no memory estimate (%s); starting it reports why", e.id, ex)
            return
        free, _ = memory_info(torch.device("cpu"))
        n = len(self.instance_configs(e, cfg))  # each model instance holds its own weights and KV pool
        if est.total * n > free:
            each = f"{n} instances x " if n > 1 else ""
            raise ConflictError(f"model {e.id} does not fit: it needs about {n * est.total / 2**30:.2f} GiB "
                                f"({each}weights {est.weights / 2**30:.2f} GiB + a minimum KV pool "
                                f"{est.kv_min / 2**30:.2f} GiB) and {free / 2**30:.2f} GiB are free")

    def need_bytes(self, e: CatalogEntry) -> int:
        """What ``e`` is expected to take once loaded, before a load measured it: the header estimate of its
        weights plus its KV pool as configured (0 for a mock, or a checkpoint whose header cannot be read)."""
        if e.mock:
            return 0
        cfg = self.engine_config(e)
        world = self.config.models[e.config_index].world_size if e.config_index is not None else 1
        try:
            return loaded_estimate(e.folder, cfg, world) * len(self.instance_configs(e, cfg))
        except (ValidationError, OSError, ValueError) as ex:
            logger.warning("model %s: no memory estimate (%s)", e.id, ex)
            return 0

    def start(self, model_id: str) -> CatalogEntry:
        """Begin starting a model (background); 409 while busy or not downloaded, 409 if it won't fit."""
        e = self.get(model_id)
        if e.state in ("running", "starting"):
            return e
        if e.state == "sleeping" and e.engine is not None:  # level 1 keeps the engine (catalog/sleep.py wakes it)
            raise ConflictError(f"model {model_id} is asleep with its weights loaded: POST /wake_up?model={model_id}")
        if e.state in ("stopping", "downloading", "not_downloaded"):
            raise ConflictError(f"model {model_id} cannot start while {e.state}")
        if not e.mock and detect(e.folder) is None:
            raise ConflictError(f"model {model_id} has no checkpoint in its folder (config.json, or one .gguf file)")
        if not e.mock:
            check_folder(e.id, e.record.format, e.folder)  # model.json's format, several .gguf files: 422
        if self.build is None:
            raise ConflictError("models cannot be started in this process (no engine builder)")
        cfg = self.engine_config(e)
        self.check_fits(e, cfg)
        e.begin_loading()
        self._spawn(self._start(e, cfg))
        return e

    async def _start(self, e: CatalogEntry, cfg: EngineConfig) -> None:
        engine, meter = None, LoadMeter()
        try:
            assert self.build is not None
            build, mock = self.build, e.mock

            def built() -> EngineClient:
                meter.begin()
                out = build_instances(self.instance_configs(e, cfg), lambda ec: build(ec, mock))
                meter.built()
                return out
            engine = await asyncio.get_running_loop().run_in_executor(None, built)
            if not e.mock and e.record.engine_parameters:  # the model.json prefixes for template-less checkpoints
                engine.input_facts.chat_prefixes = e.record.prefixes()
            engine.start()
            e.progress = {"phase": "warming up"}
            if self.warm_up is not None:
                await self.warm_up(engine)
            meter.warmed()
            e.memory = meter.result(engine, e.mock)
            e.loaded(engine)
            if e.config_index == 0:
                self.on_default(engine)
            logger.info("model %s: starting -> running (loaded in %.2f s; measured %s)", e.id, e.last_load_s or 0.0,
                        ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in e.memory.as_json().items()))
        except Exception as ex:  # a start failure is the model's state, never the server's
            logger.exception("model %s: starting -> failed", e.id)
            meter.stop()
            if engine is not None:
                engine.shutdown()
            e.state, e.error = "failed", f"{type(ex).__name__}: {ex}"

    def attach(self, model_id: str, engine: EngineClient) -> None:
        """The default model's engine, built by main at boot."""
        self.entries[model_id].loaded(engine)

    def stop(self, model_id: str) -> CatalogEntry:
        e = self.get(model_id)
        if e.state in ("stopped", "downloaded", "stopping", "not_downloaded", "failed"):
            return e
        if e.state not in ("running", "sleeping"):  # asleep: what is still loaded goes (level 1's weights)
            raise ConflictError(f"model {model_id} cannot stop while {e.state}")
        with self._lock:
            e.state = "stopping"  # new requests get 503 from here on
        if e.config_index == 0:
            self.on_default(None)
        self._spawn(self._stop(e))
        return e

    async def _stop(self, e: CatalogEntry) -> None:
        engine = e.engine
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_TIMEOUT_S
        while engine is not None and loop.time() < deadline:  # drain: the held requests finish
            st = engine.stats()
            if e.active == 0 and st.running + st.waiting == 0:
                break
            await asyncio.sleep(0.05)
        e.engine = None
        if engine is not None:
            await loop.run_in_executor(None, engine.shutdown)
            del engine
        gc.collect()  # weights and the KV pool go back now, not at some later collection
        trim_heap()  # and the heap pages they leave free go back to the system, not to the next load
        e.state, e.sleep_level = "stopped", 0
        logger.info("model %s: stopping -> stopped", e.id)

    def delete(self, model_id: str) -> None:
        e = self.get(model_id)
        if e.state in ("running", "starting", "stopping", "downloading"):
            raise ConflictError(f"model {model_id} is {e.state}; stop it before deleting it")
        if not e.owned_folder:
            raise ConflictError(f"model {model_id} is a ModelConfig entry of config.json; remove it there")
        folder = self.folder_of(model_id)  # never outside modelsDir
        user = self._sharing(e, folder)
        if user is not None:
            raise ConflictError(f"model {model_id}'s files are also used by {user}; they are not deleted")
        if folder.is_dir():
            shutil.rmtree(folder)
        del self.entries[model_id]
        logger.info("model %s deleted", model_id)

    def _sharing(self, e: CatalogEntry, folder: Path) -> str | None:
        """The first other user of any file of ``folder``: a ModelConfig entry, a LoRA module of config.json or
        another catalog model (shared_files.first_user); None when nothing else uses them."""
        users = [(f"ModelConfig entry {m.name} of config.json", Path(m.weight_path)) for m in self.config.models]
        users += [(f"LoRA module {lo.name} of config.json", Path(lo.path))
                  for lo in getattr(self.config, "lora_modules", ())]
        users += [(f"catalog model {o.id}", o.folder) for o in self.entries.values() if o is not e]
        return first_user(folder, users)

    # -- download --------------------------------------------------------------------------------
    async def download(self, model_id: str, policy: FetchPolicy, cap: int) -> CatalogEntry:
        """Check the model's source (SSRF guard, allowed folders) now, fetch it in the background."""
        from mindie_service.catalog.download import check_source  # tornado's client only when downloading

        e = self.get(model_id)
        if e.state in ("running", "starting", "stopping", "downloading"):
            raise ConflictError(f"model {model_id} cannot download while {e.state}")
        if not e.owned_folder:
            raise ConflictError(f"model {model_id} is a ModelConfig entry of config.json; its weights are not "
                                "the catalog's to replace")
        declared_kind(e.id, e.record.format)  # a format this service cannot run is refused before fetching
        src = await check_source(e.record.source_url, policy)
        before = e.state
        e.state, e.error, e.progress = "downloading", None, {"bytes_done": 0, "bytes_total": None}
        self._spawn(self._download(e, src, policy, cap, before))
        return e

    async def _download(self, e: CatalogEntry, src: Any, policy: FetchPolicy, cap: int, before: str) -> None:
        from mindie_service.catalog import download as dl

        target = self.folder_of(e.id)
        staging = self.models_dir / f".{e.id}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        prog = dl.Progress()
        loop = asyncio.get_running_loop()
        try:
            tick = asyncio.ensure_future(self._show(e, prog))
            try:
                await dl.fetch_into(e.id, e.record.assets, src, staging, cap, policy, prog)
            finally:
                tick.cancel()
            root = dl.checkpoint_root(staging)

            def keep(new: Path) -> None:
                old_json = target / "model.json"
                if old_json.is_file() and not (new / "model.json").exists():
                    shutil.copy2(old_json, new / "model.json")
            await loop.run_in_executor(None, dl.move_into_place, root, target, keep)
            e.folder, e.state = target, "downloaded"
            e.progress = {**prog.as_json(), "done": True}
            logger.info("model %s downloaded (%d bytes)", e.id, prog.bytes_done)
        except Exception as ex:  # noqa: BLE001 - the failure is the model's state; nothing is left behind
            logger.info("model %s: download failed: %s", e.id, ex)
            e.state, e.error = before, getattr(ex, "message", None) or f"{type(ex).__name__}: {ex}"
            e.progress = {}
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    @staticmethod
    async def _show(e: CatalogEntry, prog: Any) -> None:
        while True:  # progress in GET /v1/models/{id} (metadata.download) while the fetch runs
            e.progress = prog.as_json()
            await asyncio.sleep(0.2)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        t = asyncio.ensure_future(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def shutdown(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        for e in self.entries.values():
            if e.engine is not None:
                await asyncio.get_running_loop().run_in_executor(None, e.engine.shutdown)
                e.engine = None

