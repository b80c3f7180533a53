"""Deterministic Kineto-style traces of LLM decoding with CUDA Graph replays.

    python -m samples.generate --output trace.json.gz --layers 8 --iterations 6
    python -m samples.generate --output big.json --size 1GB

Each iteration (one decode step) replays draft passes and one target-verify
pass as CUDA Graphs. Every graph has private streams, so the trace shows
hundreds of GPU stream rows. A target layer is: anchor `_q_rope_store`, a norm
on a side stream, attention, a GEMM with a concurrent all-reduce and a
device-to-device copy on two more streams (peak overlap 3), and the terminal
`moe_finalize_all_reduce_kernel<4u, 5120u, 6u>`. After the last layer one more
`_q_rope_store` runs (an output head: the "extra anchor per pass"), then the
LM head and eager sampling on the default stream. Draft passes use other
kernels (`_draft_q_rope`, ...). GPU user scopes nest (step > pass), CPU ops
launch the graphs with `ac2g` flows, timestamps are epoch microseconds with
three decimals (or integers), and events are written out of time order.

`generate()` returns the ground truth the tests assert against.
"""

from __future__ import annotations

import argparse
import gzip
import random
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import zstandard

ANCHOR = "_q_rope_store"
TERMINAL = "moe_finalize_all_reduce_kernel<4u, 5120u, 6u>"
DRAFT_ANCHOR = "_draft_q_rope"
ATTENTION = (
    "flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
    "cutlass::bfloat16_t>, true>"
)
GEMM = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas"
)
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NORM = (
    "void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(c10::BFloat16*, c10::BFloat16 const*, "
    "c10::BFloat16 const*, float, int, int)"
)
MEMCPY_DTOD = "Memcpy DtoD (Device -> Device)"
# Kernel names as long as real ones (CUTLASS/Triton/vLLM templates), so event sizes
# match real Kineto traces (~700 bytes per kernel event).
DRAFT_ATTENTION = (
    "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<64, 64, 128, 4, false, false, "
    "cutlass::bfloat16_t, Flash_kernel_traits<64, 64, 128, 4, cutlass::bfloat16_t> >, "
    "false, false, false, false, true, true, false, false>(flash::Flash_fwd_params)"
)
DRAFT_GEMM = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x128x64_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas"
)
DRAFT_NORM = (
    "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16*, "
    "c10::BFloat16 const*, float, int, int)"
)
DRAFT_SAMPLE = "triton_poi_fused__to_copy_add_argmax_clamp_eq_index_put_mul_rsub_sub_where_0"
LM_HEAD = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_cluster1x2x1_"
    "warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
)
SAMPLING = (
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"
)
EPOCH_US = 1764400000000000
CPU_PID = 4242
DEFAULT_STREAM = 7
GRAPH_STREAM_BASE = 100


@dataclass
class TraceConfig:
    layers: int = 8
    iterations: int = 6
    extra_anchor: bool = True  # one more anchor match after each target pass
    draft_passes: int = 2  # per iteration
    draft_layers: int = 2
    graphs: int = 40  # distinct CUDA graphs, replayed round-robin
    streams_per_graph: int = 8
    gpus: int = 1  # processes pid 0..gpus-1 (device = pid)
    devices_per_pid: int = 1  # >1: several devices merged into one pid
    decimals: bool = True  # three-decimal µs timestamps; False: integer µs
    shuffle: bool = True
    scopes: bool = True
    bare_array: bool = False
    sync_on_device_row: bool = False  # cuda_sync on tid -1 (Kineto's device row) not the stream
    epoch_us: int = EPOCH_US  # where time starts (older Kineto: ~6.1e12 µs since boot)
    seed: int = 0
    size_bytes: int | None = None  # keep adding iterations until the file is this big


@dataclass
class GroundTruth:
    """What a generated trace contains, for tests to compare against."""

    events: int = 0
    kernels: dict = field(default_factory=dict)  # "pid/device" -> count
    activity: dict = field(default_factory=dict)  # "pid/device" -> kernels+memcpy+memset+sync
    memcpy: dict = field(default_factory=dict)
    memset: dict = field(default_factory=dict)
    sync: dict = field(default_factory=dict)
    streams: dict = field(default_factory=dict)  # "pid/device" -> distinct stream tids
    kernel_streams: dict = field(default_factory=dict)
    anchors: dict = field(default_factory=dict)  # "pid/device" -> anchor matches
    draft_anchors: dict = field(default_factory=dict)
    terminals: dict = field(default_factory=dict)
    scopes: dict = field(default_factory=dict)  # pid -> gpu_user_annotation count
    gpu_flows: dict = field(default_factory=dict)  # pid -> f events on GPU tracks
    iterations: int = 0
    peak_overlap: int = 3
    config: dict = field(default_factory=dict)
    bytes: int = 0  # uncompressed JSON bytes written


_EPOCH = [EPOCH_US]  # set per trace by generate()


def _us(ns: int, decimals: bool) -> str:
    if decimals:
        q, r = divmod(ns, 1000)
        return f"{_EPOCH[0] + q}.{r:03d}"
    return str(_EPOCH[0] + ns // 1000)


def _dur(ns: int, decimals: bool) -> str:
    if decimals:
        q, r = divmod(ns, 1000)
        return f"{q}.{r:03d}"
    return str(ns // 1000)


class _Writer:
    def __init__(self, path: Path):
        name = str(path)
        if name.endswith(".gz"):
            self._fh = gzip.open(path, "wb", compresslevel=1)
        elif name.endswith(".zst"):
            self._raw = open(path, "wb")
            self._fh = zstandard.ZstdCompressor(level=3).stream_writer(self._raw)
        else:
            self._fh = open(path, "wb", buffering=1 << 20)
        self.size = 0

    def write(self, text: str) -> None:
        data = text.encode()
        self.size += len(data)
        self._fh.write(data)

    def close(self) -> None:
        self._fh.close()
        raw = getattr(self, "_raw", None)
        if raw is not None:
            raw.close()


class _Gen:
    def __init__(self, cfg: TraceConfig, truth: GroundTruth):
        self.cfg = cfg
        self.truth = truth
        self.rng = random.Random(cfg.seed)
        self.correlation = 1000
        self.external = 1
        self.streams_seen: dict[tuple, set] = {}
        self.replay = 0

    def _count(self, table: dict, key, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def kernel(self, out: list, pid: int, device: int, tid: int, name: str, start: int, dur: int,
               cat: str = "kernel", graph: int | None = None) -> None:
        d = self.cfg.decimals
        self.correlation += 1
        key = f"{pid}/{device}"
        self._count(self.truth.activity, key)
        table = {"kernel": self.truth.kernels, "gpu_memcpy": self.truth.memcpy,
                 "gpu_memset": self.truth.memset, "cuda_sync": self.truth.sync}[cat]
        self._count(table, key)
        self.truth.streams.setdefault(key, set()).add(tid)
        if cat == "kernel":
            self.truth.kernel_streams.setdefault(key, set()).add(tid)
            if name == ANCHOR:
                self._count(self.truth.anchors, key)
            elif name == DRAFT_ANCHOR:
                self._count(self.truth.draft_anchors, key)
            elif name == TERMINAL:
                self._count(self.truth.terminals, key)
        stream = -1 if tid == -1 else tid
        graph_args = (
            f', "graph id": {graph}, "graph node id": {self.correlation}'
            if graph is not None else ""
        )
        if cat == "kernel":
            args = (
                f'"External id": {self.external}, "queued": 0, "device": {device}, "context": 1, '
                f'"stream": {stream}, "correlation": {self.correlation}, '
                f'"registers per thread": 32, '
                f'"shared memory": 0, "blocks per SM": 1.5, "warps per SM": 6.0, '
                f'"grid": [132, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 50'
                f"{graph_args}"
            )
        else:
            args = (
                f'"External id": {self.external}, "device": {device}, "context": 1, '
                f'"stream": {stream}, "correlation": {self.correlation}{graph_args}'
            )
        out.append(
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": {_q(name)}, '
            f'"pid": {pid}, "tid": {tid},\n'
            f'    "ts": {_us(start, d)}, "dur": {_dur(dur, d)},\n'
            f'    "args": {{\n      {args}\n    }}\n  }}'
        )

    def flow(
        self, out_cpu: list, out_gpu: list, cpu_ts: int, pid: int, tid: int, gpu_ts: int
    ) -> None:
        d = self.cfg.decimals
        fid = self.correlation + 1  # the correlation id of the kernel launched next
        out_cpu.append(
            f'  {{\n    "ph": "s", "id": {fid}, "pid": {CPU_PID}, "tid": {CPU_PID}, '
            f'"ts": {_us(cpu_ts, d)},'
            f' "cat": "ac2g", "name": "ac2g"\n  }}'
        )
        out_gpu.append(
            f'  {{\n    "ph": "f", "id": {fid}, "pid": {pid}, "tid": {tid}, "ts": {_us(gpu_ts, d)},'
            f' "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }}'
        )
        self._count(self.truth.gpu_flows, pid)

    def cpu(self, out: list, name: str, cat: str, start: int, dur: int, extra: str = "") -> None:
        d = self.cfg.decimals
        self.external += 1
        out.append(
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": {_q(name)}, '
            f'"pid": {CPU_PID}, "tid": {CPU_PID},\n'
            f'    "ts": {_us(start, d)}, "dur": {_dur(dur, d)},\n    "args": {{\n'
            f'      "External id": {self.external}{extra}\n    }}\n  }}'
        )

    def scope(self, out: list, pid: int, name: str, start: int, dur: int) -> None:
        d = self.cfg.decimals
        self._count(self.truth.scopes, pid)
        out.append(
            f'  {{\n    "ph": "X", "cat": "gpu_user_annotation", "name": {_q(name)}, "pid": {pid}, '
            f'"tid": {DEFAULT_STREAM},\n    "ts": {_us(start, d)}, "dur": {_dur(dur, d)},\n'
            f'    "args": {{\n      "External id": {self.external}\n    }}\n  }}'
        )

    def graph_streams(self, graph: int, device_slot: int) -> list[int]:
        per = self.cfg.streams_per_graph
        base = GRAPH_STREAM_BASE + device_slot * 10000 + graph * per
        return [base + k for k in range(per)]

    def iteration(self, it: int, t0: int, cpu: list, gpu: list) -> int:
        """One decode step starting at t0 (ns); returns its end time."""
        cfg = self.cfg
        rng = self.rng
        t_cpu = t0
        step_start = t0
        gpu_t = t0 + 20_000
        replays = []
        for k in range(cfg.draft_passes):
            replays.append(("draft", k))
        replays.append(("target", 0))
        self.cpu(cpu, f"ProfilerStep#{it}", "user_annotation", t0, 1)  # duration fixed below
        step_event = len(cpu) - 1
        for kind, k in replays:
            graph = self.replay % cfg.graphs
            self.replay += 1
            t_cpu += 3_000 + rng.randrange(500)
            launch = t_cpu
            self.cpu(cpu, "CUDAGraph.replay", "cpu_op", launch, 12_125)
            self.cpu(cpu, "cudaGraphLaunch", "cuda_runtime", launch + 1_000, 9_750,
                     extra=f', "correlation": {self.correlation + 1}')
            gpu_t = max(gpu_t, launch + 15_000)
            start = gpu_t
            for slot in range(cfg.gpus * cfg.devices_per_pid):
                pid, device = divmod(slot, cfg.devices_per_pid)
                pid_device = (pid, pid * cfg.devices_per_pid + device)
                end = self._replay(kind, k, graph, slot, pid_device, start + slot * 1_000, cpu, gpu,
                                   launch + 1_000)
            gpu_t = end + 4_000 + rng.randrange(2_000)
            if cfg.scopes:
                for slot in range(cfg.gpus):
                    name = "target_verify" if kind == "target" else f"draft_{k}"
                    self.scope(gpu, slot, name, start, end - start)
        # eager tail on the default stream: sampling, copy of tokens to host, a memset, a sync
        for slot in range(cfg.gpus * cfg.devices_per_pid):
            pid, device = divmod(slot, cfg.devices_per_pid)
            dev = pid * cfg.devices_per_pid + device
            tid = DEFAULT_STREAM + 1000 * device
            t = gpu_t + slot * 500
            t_launch = t_cpu + 2_000
            self.cpu(cpu, "cudaLaunchKernel", "cuda_runtime", t_launch, 4_500,
                     extra=f', "correlation": {self.correlation + 1}')
            self.flow(cpu, gpu, t_launch, pid, tid, t)
            self.kernel(gpu, pid, dev, tid, SAMPLING, t, 7_375)
            self.kernel(gpu, pid, dev, tid, "Memcpy DtoH (Device -> Pinned)", t + 7_375, 2_250,
                        cat="gpu_memcpy")
            self.kernel(gpu, pid, dev, tid, "Memset (Device)", t + 9_625, 1_125, cat="gpu_memset")
            sync_tid = -1 if cfg.sync_on_device_row else tid
            self.kernel(gpu, pid, dev, sync_tid, "Event Sync", t + 10_750, 3_000, cat="cuda_sync")
        gpu_t += 15_000
        step_end = gpu_t
        if cfg.scopes:
            for slot in range(cfg.gpus):
                self.scope(gpu, slot, f"decode_step#{it}", step_start + 15_000,
                           step_end - step_start - 15_000)
        cpu[step_event] = cpu[step_event].replace(
            f'"dur": {_dur(1, cfg.decimals)}',
            f'"dur": {_dur(step_end - step_start, cfg.decimals)}', 1)
        return step_end + 50_000

    def _replay(self, kind, k, graph, slot, pid_device, start, cpu, gpu, cpu_launch) -> int:
        cfg = self.cfg
        pid, device = pid_device
        streams = self.graph_streams(graph, slot)
        s0, s1, s2 = streams[0], streams[1 % len(streams)], streams[2 % len(streams)]
        side = streams[3:] or streams
        t = start
        first = True

        def k_(tid, name, ts, dur, cat="kernel"):
            nonlocal first
            if first:
                self.flow(cpu, gpu, cpu_launch, pid, tid, ts)
                first = False
            self.kernel(gpu, pid, device, tid, name, ts, dur, cat=cat, graph=graph)

        if kind == "draft":
            # sequential kernels, round-robin over every stream of the graph
            names = [(DRAFT_ANCHOR, 2_125), (DRAFT_ATTENTION, 9_500),
                     (DRAFT_GEMM, 11_000), (DRAFT_NORM, 1_500)]
            j = 0
            for _ in range(cfg.draft_layers):
                for name, dur in names:
                    k_(streams[j % len(streams)], name, t, dur)
                    t += dur + 250
                    j += 1
            while j < len(streams):
                k_(streams[j], DRAFT_SAMPLE, t, 1_250)
                t += 1_250 + 250
                j += 1
            return t
        for layer in range(cfg.layers):
            k_(s0, ANCHOR, t, 3_125)
            t += 3_125  # touching: the norm starts exactly at the anchor's end
            k_(side[layer % len(side)], NORM, t, 2_500)
            t += 2_500 + 125
            k_(s0, ATTENTION, t, 20_250)
            t += 20_250
            gemm = t
            k_(s0, GEMM, gemm, 30_000)
            k_(s1, ALLREDUCE, gemm + 5_000, 20_000)
            k_(s2, MEMCPY_DTOD, gemm + 8_000, 10_000, cat="gpu_memcpy")
            t = gemm + 30_000 + 375
            k_(s0, TERMINAL, t, 6_000)
            t += 6_000 + 250
        if cfg.extra_anchor:
            k_(s0, ANCHOR, t, 3_125)
            t += 3_125 + 500
        k_(s0, LM_HEAD, t, 25_000)
        t += 25_000
        return t


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _metadata(cfg: TraceConfig, truth: GroundTruth) -> list[str]:
    events = [
        f'  {{\n    "name": "process_name", "ph": "M", "ts": {cfg.epoch_us}, '
        f'"pid": {CPU_PID}, "tid": 0,\n'
        f'    "args": {{\n      "name": "python3"\n    }}\n  }}',
        f'  {{\n    "name": "thread_name", "ph": "M", "ts": {cfg.epoch_us}, '
        f'"pid": {CPU_PID}, "tid": {CPU_PID},\n'
        f'    "args": {{\n      "name": "thread {CPU_PID} (python3)"\n    }}\n  }}',
    ]
    for pid in range(cfg.gpus):
        events.append(
            f'  {{\n    "name": "process_name", "ph": "M", "ts": {cfg.epoch_us}, '
            f'"pid": {pid}, "tid": 0,\n'
            f'    "args": {{\n      "name": "python3"\n    }}\n  }}')
        events.append(
            f'  {{\n    "name": "process_labels", "ph": "M", "ts": {cfg.epoch_us}, '
            f'"pid": {pid}, "tid": 0,\n'
            f'    "args": {{\n      "labels": "GPU {pid}"\n    }}\n  }}')
        events.append(
            f'  {{\n    "name": "process_sort_index", "ph": "M", "ts": {cfg.epoch_us}, '
            f'"pid": {pid}, "tid": 0,\n'
            f'    "args": {{\n      "sort_index": {16777216 + pid}\n    }}\n  }}')
    tids = set()
    for key, streams in truth.streams.items():
        pid = int(key.split("/")[0])
        for tid in streams:
            tids.add((pid, tid))
    if cfg.scopes:
        tids |= {(pid, DEFAULT_STREAM) for pid in range(cfg.gpus)}
    for pid, tid in sorted(tids):
        label = "Device sync" if tid == -1 else f"stream {tid} "
        events.append(
            f'  {{\n    "name": "thread_name", "ph": "M", "ts": {cfg.epoch_us}, '
            f'"pid": {pid}, "tid": {tid},\n'
            f'    "args": {{\n      "name": "{label}"\n    }}\n  }}')
        events.append(
            f'  {{\n    "name": "thread_sort_index", "ph": "M", "ts": {cfg.epoch_us}, '
            f'"pid": {pid}, "tid": {tid},\n'
            f'    "args": {{\n      "sort_index": {tid}\n    }}\n  }}')
    return events


def generate(path, cfg: TraceConfig | None = None) -> GroundTruth:
    """Write a trace to `path` (.json, .json.gz, .json.zst) and return its ground truth."""
    cfg = cfg or TraceConfig()
    _EPOCH[0] = cfg.epoch_us
    truth = GroundTruth(config=asdict(cfg))
    path = Path(path)
    writer = _Writer(path)
    gen = _Gen(cfg, truth)
    if cfg.bare_array:
        writer.write("[\n")
    else:
        writer.write(
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n'
            '    {\n      "id": 0, "name": "NVIDIA H100 80GB HBM3", '
            '"totalGlobalMem": 85045231616,\n'
            '      "computeMajor": 9, "computeMinor": 0, "numSms": 132\n    }\n  ],\n'
            '  "cupti_version": 24,\n  "cuda_runtime_version": 12080,\n  "displayTimeUnit": "ms",\n'
            '  "baseTimeNanoseconds": 1764399999000000000,\n  "traceEvents": [\n'
        )
    first = True
    t = 0
    it = 0
    block = 8  # iterations per block: CPU events of a block, then its GPU events
    while True:
        cpu: list[str] = []
        gpu: list[str] = []
        for _ in range(block):
            if cfg.size_bytes is None and it >= cfg.iterations:
                break
            t = gen.iteration(it, t, cpu, gpu)
            it += 1
        if not cpu:
            break
        if cfg.shuffle:
            gen.rng.shuffle(gpu)
        events = cpu + gpu
        truth.events += len(events)
        writer.write(("" if first else ",\n") + ",\n".join(events))
        first = False
        if cfg.size_bytes is not None and writer.size >= cfg.size_bytes:
            break
    truth.iterations = it
    meta = _metadata(cfg, truth)
    truth.events += len(meta) + 1
    writer.write(",\n" + ",\n".join(meta))
    writer.write(
        ',\n  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n    "pid": "", "tid": "", '
        f'"ts": {_us(t, cfg.decimals)}\n  }}'
    )
    writer.write(
        "\n]\n" if cfg.bare_array
        else '\n  ],\n  "traceName": "generated by samples.generate"\n}\n'
    )
    writer.close()
    truth.bytes = writer.size
    truth.streams = {k: len(v) for k, v in truth.streams.items()}
    truth.kernel_streams = {k: len(v) for k, v in truth.kernel_streams.items()}
    return truth


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?)B?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 200MB, 1GB)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
    return int(float(m.group(1)) * scale)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m samples.generate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output", required=True, help="path (.json, .json.gz or .json.zst)")
    parser.add_argument("--size", type=parse_size, default=None, help="e.g. 1GB (uncompressed)")
    for name, default in asdict(TraceConfig()).items():
        if name == "size_bytes":
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(
                flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=default
            )
        else:
            parser.add_argument(flag, type=int, default=default)
    args = vars(parser.parse_args(argv))
    output = args.pop("output")
    size = args.pop("size")
    cfg = TraceConfig(size_bytes=size, **args)
    truth = generate(output, cfg)
    print(f"{output}: {truth.events:,} events, {truth.iterations} iterations, "
          f"kernels {truth.kernels}, streams {truth.streams}", file=sys.stderr)


if __name__ == "__main__":
    main()
