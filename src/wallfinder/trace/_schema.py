"""The typed shape of a trace event, as msgspec decodes it.

Only the fields the analyses read are declared; msgspec skips every other key without building
a Python object for it, which is most of what makes parsing fast. Fields whose type varies
between real traces (ids as int or string, bytes as int or float) are declared as unions;
shapes and types are kept as raw JSON text (`msgspec.Raw`) and only parsed when an analysis
asks for them.
"""

from __future__ import annotations

import math

import msgspec

Scalar = int | float | str | None
NO_ID = -1
"""Default of the integer fields: absent reads as -1 (the columns' NONE) with no None to
check, so a column of ids is read in one C-level pass."""
_NO_RAW = msgspec.Raw(b"")


class Args(msgspec.Struct, frozen=True, gc=False):
    """The `args` object of an event (the keys wallfinder uses)."""

    external_id: Scalar = msgspec.field(default=NO_ID, name="External id")
    correlation: Scalar = NO_ID
    device: Scalar = NO_ID
    stream: Scalar = NO_ID
    bytes_lower: Scalar = msgspec.field(default=NO_ID, name="bytes")
    bytes_upper: Scalar = msgspec.field(default=NO_ID, name="Bytes")
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    grid: msgspec.Raw = _NO_RAW
    block: msgspec.Raw = _NO_RAW
    # The autograd link: a backward op carries the `Sequence number` of the forward op that
    # made its node, and the forward thread's `Fwd thread id` (forward ops carry 0).
    sequence: Scalar = msgspec.field(default=NO_ID, name="Sequence number")
    fwd_thread: Scalar = msgspec.field(default=NO_ID, name="Fwd thread id")
    # Collectives (NCCL kernels and `record_param_comms` ops of recent PyTorch releases).
    collective: Scalar = msgspec.field(default=None, name="Collective name")
    in_nelems: Scalar = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Scalar = msgspec.field(default=None, name="Out msg nelems")
    dtype: Scalar = None
    group_size: Scalar = msgspec.field(default=None, name="Group size")
    pg_name: Scalar = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: Scalar = msgspec.field(default=None, name="Process Group Ranks")
    seq: Scalar = msgspec.field(default=None, name="Seq")
    # Metadata events ("M") carry the process or thread name and labels here.
    name: Scalar = None
    labels: Scalar = None
    # Memory events ("[memory]" instants).
    total_allocated: Scalar = msgspec.field(default=NO_ID, name="Total Allocated")
    total_reserved: Scalar = msgspec.field(default=NO_ID, name="Total Reserved")
    device_id: Scalar = msgspec.field(default=NO_ID, name="Device Id")
    device_type: Scalar = msgspec.field(default=NO_ID, name="Device Type")
    addr: Scalar = msgspec.field(default=NO_ID, name="Addr")


EMPTY_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    """One trace event. `ts` and `dur` are NaN when absent, so absence is checked in bulk."""

    ph: str = ""
    name: Scalar = ""
    cat: Scalar = ""
    ts: float = math.nan
    dur: float = math.nan
    pid: Scalar = None
    tid: Scalar = None
    id: Scalar = None
    args: Args = EMPTY_ARGS


class Header(msgspec.Struct):
    """Top-level keys of the object form that wallfinder reads (all optional)."""

    deviceProperties: list[dict[str, object]] | None = None  # noqa: N815 (the file's key)
    distributedInfo: dict[str, object] | None = None  # noqa: N815
    displayTimeUnit: str | None = None  # noqa: N815
    baseTimeNanoseconds: int | float | None = None  # noqa: N815
    wallfinder_cut_step: str | None = None
    """Written by wallfinder's capture when the program stopped inside a profiled step: the
    `ProfilerStep#N` that was cut short."""
    wallfinder_module_step: str | None = None
    """Written by wallfinder's capture: the `ProfilerStep#N` recorded with module ranges after
    the timed steps (not a timed step)."""
    wallfinder_dynamo: dict[str, object] | None = None
    """Written by `wallfinder run` when the program used torch.compile: what Dynamo counted
    (`trace.dynamo`)."""
