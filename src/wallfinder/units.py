"""How byte counts, percentages, milliseconds, source locations and kernel names are written,
in every layer: one way each, so that a finding's evidence, a check's line and a report's table
say the same thing the same way. Kernel names are here twice over, each once: as shown
(`short_kernel`, `kernel_labels`) and as the keys that join a trace's kernels to an Nsight
Compute export's launches (`normalised_name`, `base_name`, `function_name`)."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

__all__ = [
    "base_name",
    "duration",
    "function_name",
    "is_user_path",
    "kernel_labels",
    "ms",
    "normalised_name",
    "pct",
    "short_frame",
    "short_kernel",
    "short_path",
    "size",
]

_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_ABSOLUTE = re.compile(r"^(?:[A-Za-z]:)?[\\/]")
_INSTALLED = re.compile(r".*/(?:site-packages|dist-packages|lib/python3(?:\.\d+)?)/")
_FRAME = re.compile(r"^(?P<path>.+?)(?P<rest>\(\d+\): .*)$", re.DOTALL)


def size(n: float | None) -> str:
    """Bytes in binary units: 512 B, 1.50 KiB, 6.17 GiB; "?" when unknown."""
    if n is None:
        return "?"
    for unit, scale in _UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def pct(x: float | None, digits: int = 1) -> str:
    """A fraction as a percentage ("12.5%"); "?" when unknown."""
    return "?" if x is None else f"{x * 100:.{digits}f}%"


def util_pct(x: float) -> str:
    """A utilisation (MFU, MBU) as a percentage with two significant figures below 10%
    ("0.12%", "3.4%", "32%"): a whole-percent figure would print a small one as "0%"."""
    if x <= 0:
        return "0%"
    if x >= 0.1:
        return f"{x:.0%}"
    return f"{x * 100:.2g}%" if x >= 0.001 else "<0.1%"


def ms(seconds: float) -> str:
    """Seconds as milliseconds with two decimals, no unit ("12.50"): the reports' unit."""
    return f"{seconds * 1e3:.2f}"


_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))


def duration(seconds: float | None) -> str:
    """A duration in the unit a person reads it in, to three significant figures: 1.25 s,
    4.90 ms, 641 µs, 12.5 µs, 850 ns; never an exponent. Past 1000 s it stays in seconds
    ("4900 s"), under a nanosecond it is "< 1 ns"; "?" when unknown."""
    if seconds is None or seconds != seconds:
        return "?"
    if seconds == 0:
        return "0 s"
    sign = "-" if seconds < 0 else ""
    for i, (unit, scale) in enumerate(_TIME_UNITS):
        value = float(f"{abs(seconds) / scale:.3g}")
        if value >= 1000 and i > 0:
            # 999.6 µs rounds to 1000 µs: one unit up, it reads 1.00 ms.
            unit, value = _TIME_UNITS[i - 1][0], value / 1000
        if value >= 1:
            digits = 2 if value < 10 else 1 if value < 100 else 0
            return f"{sign}{value:.{digits}f} {unit}"
    return f"{sign}< 1 ns"


def short_path(path: str) -> str:
    """A source file's path without the machine's folders, which can name a user or a
    project: an installed package's path starts at the package ("torch/nn/functional.py"),
    another absolute path keeps its last two parts ("…/project/train.py"); a relative one (as
    torch's profiler records most) is unchanged."""
    if not _ABSOLUTE.match(path):
        return path
    unix = path.replace("\\", "/")
    installed = _INSTALLED.search(unix)
    if installed:  # a package's own path names nothing of the machine: torch/nn/...
        return unix[installed.end() :]
    parts = [p for p in unix.split("/") if p]
    return "…/" + "/".join(parts[-2:])


def short_frame(name: str) -> str:
    """A profiler Python frame ("path(line): function") with its path shortened."""
    m = _FRAME.match(name)
    return short_path(m["path"]) + m["rest"] if m else name


_SIGNATURE = re.compile(r"(?<=[^\s])[<(]")
"""Where a kernel's template arguments or parameters begin (not a parenthesis after a space,
as in "Memset (Device)")."""


def _without_return_type(s: str) -> str:
    """A kernel's signature without a return type other than void, such as
    "std::enable_if<...>::type vllm::rms_norm_kernel<...>(...)": the name follows the first
    space outside template brackets, when what comes before it is a qualified or templated
    type (not "Memset (Device)", whose space is part of the name)."""
    angle = paren = 0  # a ">" inside parentheses is a comparison: "<((8)>(0))>"
    for i, ch in enumerate(s):
        if ch == "(":
            if angle == paren == 0:
                return s  # the parameter list: no return type came before it
            paren += 1
        elif ch == ")" and paren:
            paren -= 1
        elif paren:
            continue
        elif ch == "<":
            angle += 1
        elif ch == ">" and angle:
            angle -= 1
        elif angle == 0 and ch == " ":
            return s[i + 1 :] if "<" in s[:i] or "::" in s[:i] else s
    return s


def _plain(name: str) -> str:
    """A kernel's signature as shown: no leading `void`, no anonymous namespaces."""
    return (
        name.removeprefix("void ").replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    )


def short_kernel(name: str, width: int | None = 60, *, aten: bool = True) -> str:
    """A kernel's name for a sentence or a table: no `void`, anonymous namespaces, template
    arguments or parameter list, at most `width` characters (None: any). `aten=False` also
    drops the `at::native::` every ATen kernel carries (the reports' tables: the JSON has the
    name whole)."""
    s = _without_return_type(_plain(name))
    cut = _SIGNATURE.search(s)
    s = s[: cut.start()] if cut else s
    if not aten:
        s = s.removeprefix("at::native::")
    return s if width is None or len(s) <= width else s[: width - 1] + "…"


_TEMPLATE_WORD = re.compile(r"[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*|\d+\w*")
"""A (qualified) identifier or a number in a kernel's template arguments and parameters."""

_LAMBDA_NUMBER = re.compile(r"#\d+")

_PLUMBING_WORDS = frozenset(
    {
        *("const", "operator", "lambda", "void", "anonymous", "namespace", "char"),
        *("gpu_kernel_impl", "gpu_kernel_impl_nocast", "TensorIteratorBase", "Array"),
        *("TrivialOffsetCalculator", "OffsetCalculator", "LoadWithCast", "StoreWithCast"),
    }
)
"""Words that never say what a kernel computes: C++'s own, and the launch machinery every
ATen elementwise kernel carries (its iterator, argument arrays, offset calculators, casts)."""

LABEL_WORDS = 3
"""The most distinguishing words a kernel's label adds to its short name."""


def kernel_labels(names: Sequence[str]) -> list[str]:
    """Labels for kernels listed together: each one's short name (`short_kernel`), and where
    distinct kernels share it (template instances: `elementwise_kernel<…add<float>…>` and
    `elementwise_kernel<…copy…<Half>…>`), the words of their template arguments and
    parameters that not all of them share, in order (`elementwise_kernel<add, float>`);
    numbered where even those agree. The same name twice gets the same label."""
    heads = [short_kernel(n, width=None) for n in names]
    groups: dict[str, list[str]] = {}
    for head, name in zip(heads, names, strict=True):
        if name not in groups.setdefault(head, []):
            groups[head].append(name)
    label: dict[str, str] = {}
    for head, members in groups.items():
        if len(members) == 1:
            label[members[0]] = head
            continue
        words = {m: _template_words(m) for m in members}
        common = set.intersection(*(set(w) for w in words.values()))
        for m in members:
            own = [w for w in words[m] if w not in common]
            more = "…" if len(own) > LABEL_WORDS else ""
            label[m] = f"{head}<{', '.join(own[:LABEL_WORDS])}{more}>" if own else head
        taken: dict[str, int] = {}
        for m in members:  # the same words (in another order, or cut): numbered
            taken[label[m]] = taken.get(label[m], 0) + 1
        seen: dict[str, int] = {}
        for m in members:
            if taken[label[m]] > 1:
                seen[label[m]] = seen.get(label[m], 0) + 1
                label[m] = f"{label[m]} #{seen[label[m]]}"
    return [label[n] for n in names]


def _template_words(name: str) -> list[str]:
    """The distinct words after a kernel's short name, each identifier without its
    namespaces (`at::native::CUDAFunctor_add` -> `CUDAFunctor_add`), plumbing left out."""
    s = _plain(name)
    cut = _SIGNATURE.search(s)
    # A lambda's number (`{lambda()#3}`) is its place in the source, not what it computes.
    tail = _LAMBDA_NUMBER.sub("", s[cut.start() :]) if cut else ""
    words: list[str] = []
    for match in _TEMPLATE_WORD.finditer(tail):
        word = match.group(0).rpartition("::")[2]
        if word not in _PLUMBING_WORDS and word not in words:
            words.append(word)
    return words


# Kernel names as join keys -------------------------------------------------------------------
# Not for display (`short_kernel` is): the keys by which a kernel of a trace and a launch of an
# Nsight Compute export are matched, so each keeps every part that tells two kernels apart in
# both spellings (namespaces, anonymous ones as "anon"), and reads ncu's mangled names.

_CASTS = re.compile(r"\((?:unsigned |signed )?(?:int|bool|long|char|short|long long)\)")
_LAMBDAS = re.compile(r"\[lambda\([^\]]*\) \(instance \d+\)\]|\{lambda\([^}]*\)#\d+\}")
_ANONYMOUS = re.compile(r"\(anonymous namespace\)|<unnamed>|\{anonymous\}")


def _mangled_base(name: str) -> str | None:
    """The qualified function name of an Itanium-mangled kernel name (`_Z13my_kernelPf`,
    `_ZN2at6native18elementwise_kernelILi128E...`), as ncu prints with `--print-kernel-base
    mangled`; None when `name` is not one this reads."""
    if not name.startswith("_Z"):
        return None
    i = 2
    nested = name.startswith("_ZN")
    if nested:
        i = 3
    parts: list[str] = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        n = int(name[i:j])
        ident = name[j : j + n]
        parts.append("anon" if ident.startswith("_GLOBAL__N") else ident)
        i = j + n
        if not nested:
            break
    return "::".join(parts) or None


def normalised_name(name: str) -> str:
    """A kernel name with what differs between demanglers taken out: a leading `void`, casts
    on template values (`(int)4`), the spelling of lambdas and anonymous namespaces, spaces.
    (A mangled name keeps its mangled form: it matches by `base_name`.)"""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    s = _ANONYMOUS.sub("anon", s)
    s = _LAMBDAS.sub("lambda", s)
    s = _CASTS.sub("", s)
    return re.sub(r"\s+", "", s)


def base_name(name: str) -> str:
    """A kernel's function name: no return type, template arguments or parameters
    (`at::native::elementwise_kernel`), as `ncu --kernel-name-base function` matches it."""
    mangled = _mangled_base(name.strip())
    if mangled is not None:
        return mangled
    s = _ANONYMOUS.sub("anon", name.strip())
    if s.startswith("void "):
        s = s[5:]
    out: list[str] = []
    depth = 0
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip()


def function_name(name: str) -> str:
    """A kernel's function name without its namespaces (`elementwise_kernel`), as ncu prints it
    with `--print-kernel-base function` and matches it with `--kernel-name`; the loosest join
    key (the name's first 60 characters when it has no function name)."""
    return base_name(name).rsplit("::", 1)[-1] or name[:60]


def is_user_path(path: str) -> bool:
    """A source file of the user's own code: a `.py` file outside torch, installed packages
    (site- or dist-packages) and the standard library. How call sites are chosen, for profiler
    frames and allocator snapshot frames alike."""
    p = path.replace("\\", "/")
    if not p.endswith(".py") or p.startswith(("torch/", "<")) or "/torch/" in p:
        return False
    if "site-packages/" in p or "dist-packages/" in p:
        return False
    return p.rsplit("/", 1)[-1].removesuffix(".py") not in sys.stdlib_module_names
