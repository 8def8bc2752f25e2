"""Build Nsight Systems SQLite exports for tests: the tables wallfinder reads, in the layout of a
recent nsys release ("2024", as `nsys export --type sqlite` 2024.6 writes them) or an older one
("2021": no NVTX string ids or domains, no version suffix on API names, no synchronisation or
OS runtime tables, `TARGET_INFO_CUDA_DEVICE` for the device), plus the tables that carry the
profiled process's environment, where a test can plant a secret."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

SECRET = "hf_PLANTEDsecretTOKEN0123456789"
"""A token planted in every place an export keeps the environment."""

_TABLES_2024 = {
    "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, "
        "gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, "
        "blockZ INTEGER, graphNodeId INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "value INTEGER NOT NULL, bytes INTEGER NOT NULL, memKind INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
        "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
        "returnValue INTEGER NOT NULL"
    ),
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "syncType INTEGER NOT NULL, eventId INTEGER NOT NULL"
    ),
    "NVTX_EVENTS": (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
        "text TEXT, globalTid INTEGER, textId INTEGER, domainId INTEGER"
    ),
    "OSRT_API": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER, nameId INTEGER NOT NULL"
    ),
    "TARGET_INFO_GPU": (
        "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, totalMemory INTEGER, "
        "smCount INTEGER, computeMajor INTEGER, computeMinor INTEGER, cuDevice INTEGER"
    ),
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "META_DATA_CAPTURE": "name TEXT NOT NULL, value TEXT",
    "TARGET_INFO_SYSTEM_ENV": (
        "globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL, "
        "nameEnum INTEGER NOT NULL, value TEXT NOT NULL"
    ),
    "ProcessStreams": "globalPid INTEGER NOT NULL, filenameId INTEGER NOT NULL, contentId INTEGER",
}

_TABLES_2021 = {
    **{
        k: v
        for k, v in _TABLES_2024.items()
        if k
        not in (
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
            "OSRT_API",
            "TARGET_INFO_GPU",
            "NVTX_EVENTS",
            "CUPTI_ACTIVITY_KIND_RUNTIME",
        )
    },
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER, "
        "correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL"
    ),
    "NVTX_EVENTS": (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
        "text TEXT, globalTid INTEGER"
    ),
    "TARGET_INFO_CUDA_DEVICE": (
        "gpuId INTEGER, cudaId INTEGER, pid INTEGER, name TEXT, totalGlobalMemory INTEGER, "
        "numMultiprocessors INTEGER"
    ),
}


def global_tid(pid: int, tid: int) -> int:
    """nsys's serialized thread id (pid in bits 24-47, tid in the low 24 bits)."""
    return (1 << 56) | (pid << 24) | tid


def global_pid(pid: int) -> int:
    return (1 << 56) | (pid << 24)


@dataclass
class NsysBuilder:
    """Rows of an export, written by `write`. Times are ns; every launch gets a runtime call
    and a device op with one correlation id."""

    variant: str = "2024"
    secret: str | None = SECRET
    strings: dict[str, int] = field(default_factory=dict)
    rows: dict[str, list[tuple[object, ...]]] = field(default_factory=dict)
    next_correlation: int = 1
    devices: dict[int, str] = field(default_factory=dict)

    def sid(self, text: str) -> int:
        return self.strings.setdefault(text, len(self.strings) + 1)

    def add(self, table: str, *row: object) -> None:
        self.rows.setdefault(table, []).append(row)

    def api_name(self, name: str) -> str:
        """Recent releases write the API version after the name."""
        versions = {"cudaLaunchKernel": "_v7000", "cudaDeviceSynchronize": "_v3020"}
        return name + versions.get(name, "_v3020") if self.variant == "2024" else name

    def device(self, device: int, name: str = "NVIDIA A100-SXM4-80GB") -> None:
        self.devices[device] = name

    def process(self, pid: int, name: str = "python3") -> None:
        self.add("PROCESSES", global_pid(pid), pid, name)
        self.add("ThreadNames", self.sid("python3"), 0, global_tid(pid, pid))

    def runtime(self, pid: int, name: str, start: int, dur: int, corr: int | None = None) -> None:
        row = [start, start + dur]
        if self.variant == "2024":
            row.append(0)  # eventClass: CUDA runtime
        row += [global_tid(pid, pid), corr, self.sid(self.api_name(name)), 0]
        self.add("CUPTI_ACTIVITY_KIND_RUNTIME", *row)

    def kernel(
        self,
        pid: int,
        device: int,
        name: str,
        launch: int,
        start: int,
        dur: int,
        *,
        stream: int = 7,
        grid: tuple[int, int, int] = (128, 1, 1),
        short: str | None = None,
    ) -> None:
        corr = self.launch(pid, "cudaLaunchKernel", launch)
        code = self.sid(name)
        self.add(
            "CUPTI_ACTIVITY_KIND_KERNEL",
            start,
            start + dur,
            device,
            1,
            stream,
            corr,
            global_pid(pid),
            code,
            self.sid(short or name.split("<")[0]),
            None,
            *grid,
            128,
            1,
            1,
            None,
        )

    def launch(self, pid: int, call: str, at: int) -> int:
        corr = self.next_correlation
        self.next_correlation += 1
        self.runtime(pid, call, at, 4_000, corr)
        return corr

    def memcpy(
        self, pid: int, device: int, launch: int, start: int, dur: int, nbytes: int = 1 << 20
    ) -> None:
        corr = self.launch(pid, "cudaMemcpyAsync", launch)
        row = (start, start + dur, device, 7, corr, global_pid(pid), nbytes, 1, 0, 2)
        self.add("CUPTI_ACTIVITY_KIND_MEMCPY", *row)

    def memset(self, pid: int, device: int, launch: int, start: int, dur: int) -> None:
        corr = self.launch(pid, "cudaMemsetAsync", launch)
        row = (start, start + dur, device, 7, corr, global_pid(pid), 0, 4096, 2)
        self.add("CUPTI_ACTIVITY_KIND_MEMSET", *row)

    def sync(self, pid: int, device: int, start: int, dur: int) -> None:
        corr = self.next_correlation
        self.next_correlation += 1
        self.runtime(pid, "cudaDeviceSynchronize", start, dur, corr)
        if self.variant == "2024":
            row = (start, start + dur, device, 7, corr, global_pid(pid), 4, 0)
            self.add("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", *row)

    def nvtx(self, pid: int, text: str, start: int, end: int | None, domain: int = 0) -> None:
        """A push/pop range (its name registered in StringIds on recent releases)."""
        if self.variant == "2024":
            row = (start, end, 59, None, None, global_tid(pid, pid), self.sid(text), domain)
        else:
            row = (start, end, 59, None, text, global_tid(pid, pid))
        self.add("NVTX_EVENTS", *row)

    def nvtx_domain(self, pid: int, domain: int, name: str) -> None:
        if self.variant == "2024":
            self.add("NVTX_EVENTS", 0, None, 75, None, name, global_tid(pid, pid), None, domain)

    def osrt(self, pid: int, name: str, start: int, dur: int) -> None:
        if self.variant == "2024":
            self.add("OSRT_API", start, start + dur, global_tid(pid, pid), self.sid(name))

    def _environment(self) -> None:
        """What nsys keeps of the process's environment and command line, with a planted
        token in each place (and in StringIds rows that nothing wallfinder reads names)."""
        token = self.secret
        if token is None:
            return
        for text in (f"HF_TOKEN={token}", f"python train.py --api-key {token}"):
            self.sid(text)
        self.add("META_DATA_CAPTURE", "PROCESS_0:ENVIRONMENT_VARIABLE", f'HF_TOKEN="{token}"')
        self.add("TARGET_INFO_SYSTEM_ENV", 0, "env", "HF_TOKEN", 1, token)
        self.add("ProcessStreams", global_pid(1), self.sid("stdout"), self.sid(f"token {token}"))
        self.add("PROCESSES", global_pid(99), 99, f"launcher --token={token}")

    def _device_rows(self) -> None:
        for device, name in self.devices.items():
            if self.variant == "2024":
                self.add("TARGET_INFO_GPU", 0, device, name, 80 << 30, 108, 8, 0, device)
            else:
                self.add("TARGET_INFO_CUDA_DEVICE", device, device, 1, name, 80 << 30, 108)

    def write(self, path: Path, *, tables: Iterable[str] | None = None) -> Path:
        """Write the export to `path`; `tables` leaves out every table not named."""
        self._environment()
        self._device_rows()
        schema = _TABLES_2024 if self.variant == "2024" else _TABLES_2021
        keep = set(tables) if tables is not None else set(schema)
        path.unlink(missing_ok=True)
        con = sqlite3.connect(path)
        with con:
            for table, columns in schema.items():
                if table in keep:
                    con.execute(f'CREATE TABLE "{table}" ({columns})')
            if "StringIds" in keep:
                con.executemany(
                    "INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in self.strings.items()]
                )
            for table, rows in self.rows.items():
                if table in keep and rows:
                    marks = ",".join("?" * len(rows[0]))
                    con.executemany(f'INSERT INTO "{table}" VALUES ({marks})', rows)
        con.close()
        return path


def training_export(
    steps: int = 5,
    *,
    variant: str = "2024",
    pid: int = 4242,
    device: int = 0,
    builder: NsysBuilder | None = None,
    data_wait_ns: int = 2_000_000,
) -> NsysBuilder:
    """A training loop: per step an NVTX `train_step` range, a wait for data, a forward
    (GEMMs and elementwise kernels), an input copy, a sync at the end."""
    b = builder or NsysBuilder(variant=variant)
    b.device(device)
    b.process(pid)
    b.nvtx_domain(pid, 1, "wallfinder-tests")
    t = 1_000_000
    kernels = (
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_nn", 900_000, (128, 1, 1)),
        ("void at::native::<unnamed>::vectorized_elementwise_kernel<4>(int)", 100_000, (64, 1, 1)),
    )
    for _ in range(steps):
        start = t
        b.osrt(pid, "poll", t, data_wait_ns)
        t += data_wait_ns
        b.memcpy(pid, device, t, t + 10_000, 200_000)
        gpu = t + 210_000
        t += 20_000
        for _ in range(4):
            for name, dur, grid in kernels:
                begin = max(gpu, t + 5_000)
                b.kernel(pid, device, name, t, begin, dur, grid=grid)
                gpu = begin + dur
                t += 10_000
        b.memset(pid, device, t, gpu, 5_000)
        t = gpu + 5_000
        b.sync(pid, device, t - 200_000, 200_000)
        t += 100_000
        b.nvtx(pid, "train_step", start, t, domain=1)
    return b
