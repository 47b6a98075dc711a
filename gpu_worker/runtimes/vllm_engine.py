"""The `vllm` runtime: a replica is a vLLM OpenAI-compatible server process for one model on one GPU.

- load: start `python -m vllm.entrypoints.openai.api_server` from the engine's own environment
  (prewarm/engines.py says where) on its own port, serving the checkpoint under the catalog id, in its
  own process group, under engine_launcher.py, which kills the whole group when the worker dies (so a
  SIGKILLed worker leaves no orphan engine), and written down in the worker's engine records (a restarted
  worker stops whatever is still recorded, engine_records.py); then wait for GET /health. A process
  that exits first, or a timeout, fails with the last lines of the engine's log: the engine's own reason.
  Before the start, every file of the checkpoint directory is checked inside the model roots (spec.roots,
  runtimes/checkpoint.check_files): the engine opens them by name, so one symlinked out is refused first.
- memory: the budget is the weights plus `kv_cache_bytes`, handed to vLLM as --kv-cache-memory-bytes on
  CPU (exact; VLLM_CPU_KVCACHE_SPACE counts whole GiB only) and as --gpu-memory-utilization (budget /
  device memory) on CUDA. measure() reports what the
  engine really holds: its process tree's RSS on CPU, its processes' device memory on CUDA (NVML).
- warm: each declared {prompt_tokens, batch} as a /v1/completions request (token-id prompts, one output
  token) until its latency is stable (runtimes/warmup.py).
- serve: a /v1/completions request; a router may also send requests itself to `endpoint`
  (http://<PREWARM_ADVERTISE_HOST or this node's address>:<port>/v1).
- release: SIGTERM the group, wait, SIGKILL, then verify that no process of the group is left and that the
  port is free (ReleaseFailed otherwise).

Host tier (issue 13 item 3): on CUDA an engine runs with --enable-sleep-mode (and VLLM_SERVER_DEV_MODE=1,
which is what exposes POST /sleep, POST /wake_up and GET /is_sleeping on its port); sleep() puts it to
sleep level 1 (weights copied to host memory, KV cache dropped: the GPU keeps only the engine's context)
and a later load() of the same runtime is a promotion: POST /wake_up, then warm as after a start
(`source` "host"). gpu_worker/sleeping_engines.py keeps sleeping engines as the node's staged copies.
CPU has no host tier for vLLM: vLLM does not support sleep mode there (it logs so and ignores the flag),
so host_tier() says why and sleep() refuses without asking the engine.

LoRA (issue 29): a base whose catalog has adapters runs with `lora` = LoraSlots: --enable-lora --max-loras
--max-cpu-loras --max-lora-rank, and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (what mounts
/v1/load_lora_adapter and /v1/unload_lora_adapter); runtimes/vllm_adapter.py loads adapters into it.

CUDA graphs: vLLM captures its own for its batch sizes on CUDA unless --enforce-eager is passed, and this
runtime never passes it; on CPU vLLM captures none (its CPU platform empties the capture sizes).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from gpu_worker.runtimes import CheckCancel, Progress, ReplicaSpec
from gpu_worker.runtimes.checkpoint import check_files, read_checkpoint
from gpu_worker.runtimes.engine_records import (
    ENGINE_ID_ENV,
    EngineRecord,
    EngineRecords,
    group_members,
    port_is_free,
)
from gpu_worker.runtimes.errors import (
    BadServeRequest,
    EngineFailed,
    EngineNotInstalled,
    EngineWarmupFailed,
    ReleaseFailed,
)
from gpu_worker.runtimes.warmup import run_until_stable
from prewarm.config import Settings
from prewarm.engines import vllm_python

GiB = 1 << 30
LAUNCHER = Path(__file__).with_name("engine_launcher.py")
LOG_TAIL_LINES = 30
NO_HOST_TIER_CPU = ("vLLM's host tier is its sleep mode (level 1: weights to host memory, wake_up to promote), "
                    "which vLLM does not support on CPU; a vllm replica on a CPU device has no host tier")
SLEEP_TIMEOUT = 300.0  # seconds for /sleep or /wake_up to answer: a large model's weights cross PCIe
MAX_MODEL_LEN = 2048  # at most: the config's max_position_embeddings when smaller

@dataclass(frozen=True)
class LoraSlots:
    """An engine's LoRA settings (the catalog's max_adapters, max_cpu_adapters, max_lora_rank)."""

    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int

    def args(self) -> list[str]:
        return ["--enable-lora", "--max-loras", str(self.max_loras), "--max-cpu-loras", str(self.max_cpu_loras),
                "--max-lora-rank", str(self.max_lora_rank)]


# Engines are started from this one long-lived thread: the kernel's parent-death signal fires when the
# *thread* that forked the launcher exits, and a task thread may exit long before the worker does.
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="prewarm-engine-spawner")


def advertise_host(env: dict[str, str] | None = None) -> str:
    """The host a router reaches this node's engines at: Settings.advertise_host (PREWARM_ADVERTISE_HOST),
    else this node's address."""
    chosen = Settings.from_env(env).advertise_host
    if chosen:
        return chosen
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


class VllmRuntime:
    """One vLLM server process hosting one replica; see the module docstring."""

    name = "vllm"
    # An engine's footprint moves while it serves (KV blocks, allocator, compiled kernels): the heartbeat
    # measures it again at least this often, so the fleet shows what it holds now, not only at ready.
    remeasure_seconds: float | None = 5.0

    def __init__(self, spec: ReplicaSpec, *, python: Path | str | None = None, port: int | None = None,
                 bind_host: str | None = None, host: str | None = None, start_timeout: float = 600.0,
                 term_grace: float = 20.0, log_dir: Path | str | None = None,
                 extra_args: tuple[str, ...] = (), records: EngineRecords | None = None,
                 lora: LoraSlots | None = None) -> None:
        self.spec = spec
        self.lora = lora  # LoRA enabled (adapters loaded at run time) when set
        self.records = records  # where the started engine is written down (a restarted worker reaps it)
        self.engine_id = os.urandom(8).hex()
        self._python = Path(python) if python else None
        self._want_port = port
        self.host = host or advertise_host()
        # Loopback advertised: listen on loopback only; otherwise on every interface so routers reach it.
        self.bind_host = bind_host or ("127.0.0.1" if self.host.startswith("127.") or self.host == "localhost"
                                       else "0.0.0.0")
        self.start_timeout = start_timeout
        self.term_grace = term_grace
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.gettempdir()) / "prewarm-engines"
        self.extra_args = tuple(extra_args)
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None
        self.log_path: Path | None = None
        self.weights_bytes = 0
        self.max_model_len = MAX_MODEL_LEN
        self.vocab = 2
        self.timings: dict[str, float] = {}  # process_start_seconds, health_seconds (load), warmup_seconds
        self._held = 0
        self._healthy = False
        self.asleep = False  # put to sleep (level 1): the next load() wakes it instead of starting one
        self.source = "storage"  # where the last load() came from: "host" for a wake_up
        self.measured_at = 0.0  # monotonic time of the last measure()

    # --- protocol ---------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str | None:
        return f"http://{self.host}:{self.port}/v1" if self.port is not None and self.proc is not None else None

    def required_bytes(self) -> int:
        ck = read_checkpoint(self.spec.path, self.spec.where, self.spec.roots)
        self.weights_bytes = ck.data_bytes
        self.max_model_len = min(MAX_MODEL_LEN, int(ck.config.get("max_position_embeddings") or MAX_MODEL_LEN))
        self.vocab = int(ck.config.get("vocab_size") or 2)
        return self.weights_bytes + self.spec.kv_cache_bytes

    def load(self, progress: Progress | None = None, check_cancel: CheckCancel | None = None) -> int:
        need = self.required_bytes() if not self.weights_bytes else self.weights_bytes + self.spec.kv_cache_bytes
        if self.asleep and self.proc is not None:
            return self._promote(need, progress, check_cancel)
        self.source = "storage"
        python = self._python or vllm_python()
        if python is None or not Path(python).is_file():
            raise EngineNotInstalled(f"{self.spec.where}: the vllm engine is not installed; run "
                                     "`prewarm engines install vllm` (scripts/install-vllm.sh)")
        # The engine reads the directory by name: every file in it checked inside the roots just before.
        check_files(self.spec.path, self.spec.roots, self.spec.where)
        if progress:
            progress(0, need)
        try:
            self._start(Path(python))
            self._wait_healthy(check_cancel)
        except BaseException:
            self._stop_quietly()
            raise
        if progress:
            progress(need, need)
        return self.measure()

    def warm(self, check_cancel: CheckCancel | None = None) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        try:
            out = self.warm_entries(self.spec.warmup, self.spec.model, self.spec.where, self.spec.policy, check_cancel)
        except BaseException:
            self._stop_quietly()
            raise
        self.timings["warmup_seconds"] = time.perf_counter() - t0
        self._held = self.measure()
        return out

    def warm_entries(self, warmup: tuple[Any, ...], model: str, where: str, policy: Any,
                     check_cancel: CheckCancel | None) -> list[dict[str, Any]]:
        """Each declared {prompt_tokens, batch} as /v1/completions requests for `model` (the base, or an
        adapter loaded into this engine) until its latency is stable; per-entry figures."""
        out = []
        for i, w in enumerate(warmup):
            if w.prompt_tokens >= self.max_model_len:
                raise EngineWarmupFailed(f"{where}: warmup entry #{i} has {w.prompt_tokens} prompt "
                                         f"tokens; the engine serves at most {self.max_model_len - 1}")
            prompts = [[(7 + 31 * (b + 1) * (j + 1)) % max(3, self.vocab - 1) + 1 for j in range(w.prompt_tokens)]
                       for b in range(w.batch)]
            body = {"prompt": prompts if w.batch > 1 else prompts[0], "max_tokens": 1, "temperature": 0.0}

            def one(body: dict[str, Any] = body, i: int = i) -> None:
                try:
                    self._completion(body, model)
                except EngineFailed as exc:
                    raise EngineWarmupFailed(f"{where}: warmup entry #{i}: {exc}") from None

            fig = run_until_stable(one, policy, check_cancel)
            out.append({"prompt_tokens": w.prompt_tokens, "batch": w.batch, **fig})
        return out

    def serve(self, request: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(request, dict) or "prompt" not in request:
            raise BadServeRequest(f"{self.spec.where}: a vllm request is a /v1/completions body with a "
                                  "`prompt` (text or token ids), e.g. {\"prompt\": \"Hello\", \"max_tokens\": 8}")
        t0 = time.perf_counter()
        answer = self._completion({k: v for k, v in request.items() if k != "model"})
        latency = time.perf_counter() - t0
        choice = (answer.get("choices") or [{}])[0]
        return {"model": self.spec.model, "latency_ms": round(latency * 1000, 3), "latency_seconds": latency,
                "text": choice.get("text"), "usage": answer.get("usage"), "endpoint": self.endpoint}

    def measure(self) -> int:
        """Bytes the engine holds now: its process tree's memory on CPU (proportional set size, so the
        libraries its processes share count once; RSS where PSS cannot be read), its processes' device
        memory on CUDA."""
        if self.proc is None:
            return 0
        self.measured_at = time.monotonic()
        procs = self._tree()
        if self.spec.device.startswith("cuda"):
            used = _cuda_process_bytes({p.pid for p in procs}, self.spec.device)
            if used is not None:
                return used
        total = 0
        for p in procs:
            try:
                total += getattr(p.memory_full_info(), "pss", 0) or p.memory_info().rss
            except psutil.AccessDenied:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total

    def died(self) -> str | None:
        """None while the engine process runs; once it exited, why: its status and its log's last lines
        (the engine's own reason). The worker's heartbeat asks, so an engine dying while ready is noticed."""
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            return None
        tail = log_tail(self.log_path) if self.log_path else ""
        return (f"{self.spec.where}: the vllm engine exited with status {rc} while serving (log: {self.log_path})"
                + (f"\n--- last lines of the engine's log ---\n{tail}" if tail else ""))

    def release(self) -> int:
        """Stop the engine and verify it is gone (no process of its group, port free); returns the bytes
        it held (last measured). Idempotent."""
        if self.proc is None:
            return 0
        held = max(self._held, self.measure())
        # The port is checked only once the engine held it (healthy): one that failed to bind never had it.
        pgid, port = self.pgid, self.port if self._healthy else None
        self._terminate()
        left = group_members(pgid) if pgid is not None else []
        if left:
            raise ReleaseFailed(f"{self.spec.where}: engine process(es) {', '.join(str(p.pid) for p in left)} "
                                f"of group {pgid} survived SIGKILL")
        deadline = time.monotonic() + 10.0
        while port is not None and not port_is_free(port, self.bind_host) and time.monotonic() < deadline:
            time.sleep(0.05)
        if port is not None and not port_is_free(port, self.bind_host):
            raise ReleaseFailed(f"{self.spec.where}: port {port} is still taken after the engine stopped")
        if self.records is not None:  # verified gone: nothing for a restarted worker to reap
            self.records.remove(self.spec.gpu or self.spec.device, self.engine_id)
        self.proc, self.pgid, self.port, self._held, self._healthy = None, None, None, 0, False
        self.asleep = False
        return held

    # --- host tier (CUDA: sleep level 1) --------------------------------------------------------------
    def host_tier(self) -> str | None:
        """None where this replica can sleep (its host tier), else why it cannot."""
        if not self.spec.device.startswith("cuda"):
            return NO_HOST_TIER_CPU
        return None

    def sleep(self) -> int:
        """Sleep level 1: the engine copies its weights to host memory and drops its KV cache; it keeps its
        process, port and CUDA context. Returns the device bytes it holds asleep (measured)."""
        why = self.host_tier()
        if why is not None:
            raise EngineFailed(f"{self.spec.where}: cannot sleep: {why}")
        if self.proc is None or not self._healthy:
            raise EngineFailed(f"{self.spec.where}: cannot sleep: no engine is running")
        t0 = time.perf_counter()
        self._dev_call("POST", "/sleep?level=1")
        if not self._is_sleeping():
            raise EngineFailed(f"{self.spec.where}: the engine answered /sleep but /is_sleeping says it is awake "
                               "(was it started with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1?)",
                               self._tail_if_dead())
        self.asleep = True
        self.timings["sleep_seconds"] = time.perf_counter() - t0
        self._held = self.measure()
        return self._held

    def _promote(self, need: int, progress: Progress | None, check_cancel: CheckCancel | None) -> int:
        """load() of a sleeping engine: POST /wake_up, verified by /is_sleeping (the host tier's promotion)."""
        if check_cancel is not None:
            check_cancel()
        if progress:
            progress(0, need)
        t0 = time.perf_counter()
        try:
            self._dev_call("POST", "/wake_up")
            if self._is_sleeping():
                raise EngineFailed(f"{self.spec.where}: the engine answered /wake_up but still sleeps",
                                   self._tail_if_dead())
        except BaseException:
            self._stop_quietly()
            raise
        self.asleep, self.source = False, "host"
        self.timings["wake_seconds"] = time.perf_counter() - t0
        if progress:
            progress(need, need)
        return self.measure()

    def _is_sleeping(self) -> bool:
        return bool(self._dev_call("GET", "/is_sleeping").get("is_sleeping"))

    def _dev_call(self, method: str, path: str) -> dict[str, Any]:
        assert self.port is not None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                     data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=SLEEP_TIMEOUT) as r:
                body = r.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:2000]
            hint = " (the engine has no sleep endpoints: VLLM_SERVER_DEV_MODE=1 is unset)" if exc.code == 404 else ""
            raise EngineFailed(f"{self.spec.where}: {method} {path} answered {exc.code}{hint}: {detail}",
                               self._tail_if_dead()) from None
        except (urllib.error.URLError, OSError) as exc:
            raise EngineFailed(f"{self.spec.where}: {method} {path}: the engine did not answer: {exc}",
                               self._tail_if_dead()) from None
        try:
            return json.loads(body) if body else {}
        except ValueError:
            return {}

    # --- the process ------------------------------------------------------------------------------
    def command(self, python: Path, port: int) -> list[str]:
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.spec.path),
               "--served-model-name", self.spec.model, "--host", self.bind_host, "--port", str(port),
               "--max-model-len", str(self.max_model_len), "--tokenizer", str(self.spec.path),
               "--generation-config", "vllm"]
        if self.spec.device.startswith("cuda"):
            total = self.spec.device_total_bytes or _cuda_total_bytes(self.spec.device)
            if total:
                util = min(0.95, (self.weights_bytes + self.spec.kv_cache_bytes) / total)
                cmd += ["--gpu-memory-utilization", f"{max(util, 0.01):.4f}"]
            cmd += ["--enable-sleep-mode"]  # the host tier (sleep level 1); no --enforce-eager: graphs captured
        else:
            # Exact bytes: VLLM_CPU_KVCACHE_SPACE (vLLM calls it legacy) counts whole GiB, so it cannot say
            # 256 MiB; on CPU this flag also skips vLLM's check against 90% of the node's memory.
            cmd += ["--kv-cache-memory-bytes", str(self.spec.kv_cache_bytes)]
        if self.lora is not None:
            cmd += self.lora.args()
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
        env["PYTHONUNBUFFERED"] = "1"
        env["HF_HUB_OFFLINE"] = "1"  # a local checkpoint: never reach for a hub
        env["VLLM_NO_USAGE_STATS"] = "1"
        env["DO_NOT_TRACK"] = "1"
        env[ENGINE_ID_ENV] = self.engine_id  # every process of the engine carries it (engine_records.py)
        if self.lora is not None:  # what mounts /v1/load_lora_adapter and /v1/unload_lora_adapter
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.spec.device.startswith("cuda"):
            env["CUDA_VISIBLE_DEVICES"] = self.spec.device.partition(":")[2] or "0"
            # What mounts /sleep, /wake_up and /is_sleeping (vLLM's dev endpoints) on the engine's port.
            env["VLLM_SERVER_DEV_MODE"] = "1"
        else:
            env["VLLM_TARGET_DEVICE"] = "cpu"
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override the exact --kv-cache-memory-bytes
        return env

    def _start(self, python: Path) -> None:
        port = self._want_port or free_port(self.bind_host)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"{self.spec.model}@{self.spec.version}-{port}.log".replace("/", "_")
        cmd = [str(python), str(LAUNCHER), str(os.getpid())] + self.command(python, port)
        env = self.environment()
        t0 = time.perf_counter()
        with self.log_path.open("wb") as log:
            log.write(("$ " + " ".join(cmd[3:]) + "\n").encode())
            log.flush()

            def spawn() -> subprocess.Popen[bytes]:
                return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True, close_fds=True)

            self.proc = _spawner.submit(spawn).result()
        self.pgid = self.proc.pid  # start_new_session: the launcher leads its own session and group
        self.port = port
        if self.records is not None:
            try:
                created = psutil.Process(self.proc.pid).create_time()
            except psutil.Error:
                created = 0.0  # exited already: the health wait says why
            self.records.add(EngineRecord(engine_id=self.engine_id, gpu=self.spec.gpu or self.spec.device,
                                          model=self.spec.model, version=self.spec.version, pid=self.proc.pid,
                                          create_time=created, port=port, worker_pid=os.getpid(),
                                          log=str(self.log_path), pgid=self.pgid))
        self.timings["process_start_seconds"] = time.perf_counter() - t0

    def _wait_healthy(self, check_cancel: CheckCancel | None) -> None:
        assert self.proc is not None and self.port is not None
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.start_timeout
        url = f"http://127.0.0.1:{self.port}/health"  # the worker is on the engine's host: loopback always works
        while True:
            if check_cancel is not None:
                check_cancel()
            rc = self.proc.poll()
            if rc is not None:
                raise EngineFailed(f"{self.spec.where}: the vllm engine exited with status {rc} before it was "
                                   f"healthy (log: {self.log_path})", log_tail(self.log_path) if self.log_path else "")
            try:
                with urllib.request.urlopen(url, timeout=2.0) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise EngineFailed(f"{self.spec.where}: the vllm engine was not healthy within "
                                   f"{self.start_timeout:.0f} s (log: {self.log_path})",
                                   log_tail(self.log_path) if self.log_path else "")
            time.sleep(0.2)
        self._healthy = True
        self.timings["health_seconds"] = time.perf_counter() - t0

    def _completion(self, body: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """A /v1/completions request to the engine, for `model` (an adapter's name; default the base)."""
        assert self.port is not None
        data = json.dumps({"model": model or self.spec.model, **body}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=data,
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=120.0) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:2000]
            if 400 <= exc.code < 500:
                raise BadServeRequest(f"{self.spec.where}: the engine refused the request ({exc.code}): {detail}") \
                    from None
            raise EngineFailed(f"{self.spec.where}: the engine answered {exc.code}: {detail}",
                               self._tail_if_dead()) from None
        except (urllib.error.URLError, OSError) as exc:
            raise EngineFailed(f"{self.spec.where}: the engine did not answer: {exc}", self._tail_if_dead()) from None

    def _tail_if_dead(self) -> str:
        if self.proc is not None and self.proc.poll() is not None and self.log_path:
            return log_tail(self.log_path)
        return ""

    def _tree(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def _terminate(self) -> None:
        proc, pgid = self.proc, self.pgid
        if proc is None or pgid is None:
            return
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=self.term_grace)
        except subprocess.TimeoutExpired:
            pass
        # The launcher is gone (or stuck): whatever of the group is left goes now.
        deadline = time.monotonic() + 10.0
        while True:
            _signal_group(pgid, signal.SIGKILL)
            if proc.poll() is None:
                try:
                    proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
            if not group_members(pgid) or time.monotonic() > deadline:
                break
            time.sleep(0.05)

    def _stop_quietly(self) -> None:
        """Used on a failed start or warmup: no process, no port left; the caller's error stands."""
        try:
            self.release()
        except ReleaseFailed:
            pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _nvml() -> Any | None:
    try:
        import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py: present where CUDA is
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no NVML: no CUDA figures
        return None


def _cuda_process_bytes(pids: set[int], device: str) -> int | None:
    nv = _nvml()
    if nv is None:
        return None
    try:
        h = nv.nvmlDeviceGetHandleByIndex(int(device.partition(":")[2] or 0))
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
        return sum(int(p.usedGpuMemory or 0) for p in procs if p.pid in pids)
    except Exception:  # noqa: BLE001
        return None


def _cuda_total_bytes(device: str) -> int | None:
    nv = _nvml()
    if nv is None:
        return None
    try:
        return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(int(device.partition(":")[2] or 0))).total)
    except Exception:  # noqa: BLE001
        return None

