"""What links a host's GPUs, recorded beside every multi-GPU result: `nvidia-smi topo -m` (NVLink or
PCIe between each pair, CPU and NUMA affinity) and a measured matrix of copy bandwidth between every
pair of devices. The copies go through a DeviceLayer, so the measurement is tested on the CPU with
simulated devices and links; a machine without nvidia-smi records why the topology is missing."""

from __future__ import annotations

import statistics
import subprocess
from typing import Any, Callable

from .parts import FLOAT_BYTES

TOPOLOGY_COMMAND = ("nvidia-smi", "topo", "-m")
PROBE_BYTES = 256 << 20   # per copy: long enough that a link's latency is lost in its bandwidth
PROBE_LINES = 1024        # the copy as 1024 dense lines (one 2-D copy, pitch = width)


def nvidia_smi_topology(run: Callable = subprocess.run, timeout_s: float = 30.0) -> dict:
    """{"command", "text": nvidia-smi's matrix, or None, "error": why there is none, or None}."""
    command = " ".join(TOPOLOGY_COMMAND)
    try:
        done = run(list(TOPOLOGY_COMMAND), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return {"command": command, "text": None, "error": "nvidia-smi is not on PATH"}
    except subprocess.TimeoutExpired:
        return {"command": command, "text": None, "error": f"nvidia-smi did not answer within {timeout_s:g} s"}
    except OSError as exc:
        return {"command": command, "text": None, "error": f"nvidia-smi could not run: {exc}"}
    if done.returncode != 0:
        why = (done.stderr or done.stdout or "").strip() or "no message"
        return {"command": command, "text": None, "error": f"nvidia-smi exited with {done.returncode}: {why}"}
    return {"command": command, "text": done.stdout.rstrip("\n"), "error": None}


def peer_bandwidth(layer: Any, devices: list[int], nbytes: int | None = None, repeats: int = 5) -> dict:
    """GB/s of one copy of `nbytes` (default PROBE_BYTES) from each device (rows) to each device
    (columns), the median of `repeats` timed by CUDA events on a stream of the destination after
    one untimed copy (which enables peer access). The diagonal is a copy within one device's
    memory. A copy too fast for the events to time reads None."""
    devices = sorted(set(devices))
    nbytes = nbytes or PROBE_BYTES
    cols = max(1, nbytes // (FLOAT_BYTES * PROBE_LINES))
    nbytes = FLOAT_BYTES * PROBE_LINES * cols
    sources, targets = {}, {}
    try:
        for device in devices:
            sources[device] = layer.allocate(device, PROBE_LINES, cols, "row")
            targets[device] = layer.allocate(device, PROBE_LINES, cols, "row")
        matrix = []
        for src in devices:
            row = []
            for dst in devices:
                stream = layer.stream(dst, "probe")
                layer.copy(targets[dst], sources[src], stream)
                times = []
                for _ in range(repeats):
                    start = layer.record(dst, stream)
                    layer.copy(targets[dst], sources[src], stream)
                    end = layer.record(dst, stream)
                    layer.synchronize(dst)
                    times.append(layer.elapsed_ms(start, end))
                ms = statistics.median(times)
                row.append(round(nbytes / (ms * 1e6), 1) if ms > 0 else None)
            matrix.append(row)
    finally:
        for region in (*sources.values(), *targets.values()):
            layer.free(region)
    return {"devices": devices, "bytes": nbytes, "repeats": repeats, "gbps": matrix,
            "method": "median of CUDA-event-timed copies (cudaMemcpy2DAsync, cudaMemcpyDefault) on a stream "
                      "of the destination; rows: source device, columns: destination"}


def record_links(layer: Any, devices: list[int], run: Callable = subprocess.run, **probe) -> dict:
    """What every multi-GPU result carries: {"topology": ..., "peer_bandwidth": ...}."""
    return {"topology": nvidia_smi_topology(run), "peer_bandwidth": peer_bandwidth(layer, devices, **probe)}


def links_markdown(links: dict) -> str:
    """The bandwidth matrix as a table and nvidia-smi's matrix as it printed it (or why it is missing)."""
    bandwidth, topology = links["peer_bandwidth"], links["topology"]
    devices = bandwidth["devices"]
    lines = [f"Peer copy bandwidth, GB/s ({bandwidth['bytes'] >> 20} MiB per copy, {bandwidth['method']}):", "",
             "| from \\ to | " + " | ".join(f"GPU {d}" for d in devices) + " |",
             "|---|" + "---:|" * len(devices)]
    for src, row in zip(devices, bandwidth["gbps"]):
        lines.append(f"| GPU {src} | " + " | ".join("-" if v is None else f"{v:.1f}" for v in row) + " |")
    lines += ["", f"`{topology['command']}`:", ""]
    if topology["text"] is None:
        lines.append(f"not recorded: {topology['error']}")
    else:
        lines += ["```", topology["text"], "```"]
    return "\n".join(lines) + "\n"
