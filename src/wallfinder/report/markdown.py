"""The Markdown report: a summary fit for a pull-request comment (GitHub-flavoured Markdown).

Strings from the trace are either code spans (names: no Markdown, HTML, link or mention is read
in them) or escaped text (sentences that quote names, such as a finding's evidence), so a name
can neither format the comment nor inject HTML into it.
"""

from __future__ import annotations

import re

from wallfinder.diagnosis import CounterReport, Diagnosis
from wallfinder.report import _format as fmt
from wallfinder.report._compiled import compiled_head, compiled_lines
from wallfinder.report._parallel import parallelism_head, parallelism_lines
from wallfinder.report._serving import serving_head, serving_lines

__all__ = ["render_counters_markdown", "render_markdown"]

TOP_KERNELS = 8
NAME_CHARS = 80
"""Names are cut to this many characters; the JSON report has them whole."""

_MARK = {"yes": "✅ yes", "no": "❌ no", "unknown": "❔ unknown"}
_SPECIAL = re.compile(r"([\\`*_\[\]<>#+!|~])")


def render_markdown(d: Diagnosis) -> str:
    """The diagnosis as a Markdown summary: the verdict and its four questions, the step
    time and its breakdown, the fixes ranked by their bound on gain, the top kernels (or CPU
    ops), and MFU."""
    v = d.verdict
    cause = fmt.verdict_label(v, d.breakdown.basis)
    out = [
        f"### wallfinder: **{v.wall.upper()} wall** — {text(cause)}",
        "",
        f"{code(d.source)} · {text(fmt.title_line(d))}",
        "",
        *([f"_{text(d.device.note)}_", ""] if d.device.note else []),
        f"> {text(v.reason)}",
        "",
        *(
            [f"**Confidence: low** — {text('; '.join(v.thin_evidence))}", ""]
            if v.thin_evidence
            else []
        ),
        "| # | question | answer | detail |",
        "|---|---|---|---|",
    ]
    out += [
        f"| {i} | {text(q.question)} | {_MARK[q.answer]} | {text(q.detail)} |"
        for i, q in enumerate(v.questions, 1)
    ]
    s = d.steps
    out += [
        "",
        f"**Step time** median {fmt.ms(s.median_s)} ms (range {fmt.ms(s.min_s)}–"
        f"{fmt.ms(s.max_s)} ms, CV {fmt.pct(s.cv)}) over {s.count} steps"
        + ("" if s.stable else " — **unstable**"),
        "",
        *_breakdown(d),
        *_phases(d),
        *_findings(d),
        *_what_if(d),
        *_memory(d),
        *_top(d),
        "",
        _mfu(d),
    ]
    out += _job(d)
    out += _parallelism(d)
    out += _compiled(d)
    out += _serving(d)
    out += _counters(d)
    if d.not_computed:
        out += ["", *(f"- **{text(line)}**" for line in fmt.not_computed_lines(d))]
    if d.warnings:
        out += ["", *(f"- _note:_ {text(w)}" for w in d.warnings)]
    out += ["", f"<sub>wallfinder · {d.schema}</sub>", ""]
    return "\n".join(out)


def code(value: str, *, table: bool = False, width: int = NAME_CHARS) -> str:
    """`value` as an inline code span: no Markdown, HTML or mention is read inside, and the
    fence is longer than any run of backticks in it. In a table cell, `|` is escaped (GFM
    splits cells on it even inside code)."""
    value = fmt.ellipsize(value, width)
    if table:
        value = value.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", value)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if value.startswith("`") or value.endswith("`") or not value.strip() else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def text(value: str) -> str:
    """`value` as plain text on one line: Markdown punctuation backslash-escaped (`\\<` keeps
    an angle bracket from opening an HTML tag), `&` as an entity, and a word joiner after `@`
    so that no name in it mentions anyone."""
    escaped = _SPECIAL.sub(r"\\\1", " ".join(value.split()).replace("&", "&amp;"))
    return escaped.replace("@", "@\u2060")


def _counters(d: Diagnosis) -> list[str]:
    c = d.counters
    if c is not None and c.mismatch is not None:
        return ["", f"**Hardware counters** ({code(c.source)}): {text(c.mismatch)}"]
    if c is None or not c.checks:
        return []
    out = [
        "",
        f"**Hardware counters** ({code(c.source)}): the roofline's bound per kernel",
        "",
        "| kernel | estimate | counters | status |",
        "|---|---|---|---|",
    ]
    out += [
        f"| {code(fmt.short_kernel(k.kernel), table=True)} | {k.estimated_bound or '?'} | "
        f"{k.counter_bound or '?'} | {k.status} |"
        for k in c.checks
    ]
    out += [f"- {text(f.title)}" for f in c.findings]
    return out


def _what_if(d: Diagnosis) -> list[str]:
    rows = fmt.what_if_cells(d)
    if not rows:
        return []
    return [
        "",
        f"**What if** — {text(fmt.critical_path_line(d))}",
        "",
        "| fix | step | speed-up | wall after |",
        "|---|---|---|---|",
        *(f"| {' | '.join(text(c) for c in row)} |" for row in rows),
    ]


def _compiled(d: Diagnosis) -> list[str]:
    head = compiled_head(d)
    if not head:
        return []
    return ["", f"**{text(head)}**", "", *(f"- {text(line)}" for line in compiled_lines(d))]


def _serving(d: Diagnosis) -> list[str]:
    head = serving_head(d)
    if not head:
        return []
    return ["", f"**{text(head)}**", "", *(f"- {text(line)}" for line in serving_lines(d))]


def _parallelism(d: Diagnosis) -> list[str]:
    head = parallelism_head(d)
    if not head:
        return []
    return ["", f"**{text(head)}**", "", *(f"- {text(line)}" for line in parallelism_lines(d))]


def _job(d: Diagnosis) -> list[str]:
    if d.job is None:
        return []
    memory = fmt.ranks_have_memory(d)
    out = [
        "",
        "**Ranks**",
        "",
        "| rank | steps | median ms | compute | comm exposed | wait ms/step | last | "
        + ("peak mem | " if memory else "")
        + "verdict |",
        "|---|---|---|---|---|---|---|" + ("---|" if memory else "") + "---|",
    ]
    for r in d.ranks:
        out.append(  # noqa: PERF401 (one row per item, built in several lines)
            f"| {'?' if r.rank is None else r.rank} | {r.steps} | {fmt.ms(r.median_step_s)} | "
            f"{fmt.pct(r.compute)} | {fmt.pct(r.comm_exposed)} | "
            f"{'?' if r.wait_s is None else fmt.ms(r.wait_s)} | "
            f"{'?' if r.late_share is None else fmt.pct(r.late_share, 0)} | "
            + (f"{fmt.size(r.peak_allocated)} | " if memory else "")
            + f"{text(fmt.cause_label(r.wall, r.cause))} |"
        )
    out += ["", *(f"- {text(line)}" for line in fmt.job_lines(d))]
    rows = fmt.collective_cells(d)
    if rows:
        out += [
            "",
            "| " + " | ".join(fmt.COLLECTIVE_COLUMNS) + " |",
            "|" + "---|" * len(fmt.COLLECTIVE_COLUMNS),
            *("| " + " | ".join(text(c) for c in row) + " |" for row in rows),
        ]
    return out


def _breakdown(d: Diagnosis) -> list[str]:
    b = d.breakdown
    step_ms = b.per_step_ms["step"]
    rows = ["| part | share | ms/step |", "|---|---:|---:|"]
    for part, share in fmt.breakdown_parts(d):
        rows.append(f"| {fmt.part_label(d, part)} | {fmt.pct(share)} | {share * step_ms:.2f} |")
        if part == "idle":
            for cause, c in fmt.idle_causes(d):
                rows.append(f"| ↳ {fmt.idle_label(d, cause)} | {fmt.pct(c)} | {c * step_ms:.2f} |")
    if fmt.graph_line(d):
        rows += ["", fmt.graph_line(d)]
    return rows


def _phases(d: Diagnosis) -> list[str]:
    """The step by phase and the largest modules ([] when the diagnosis has neither)."""
    if d.phases is None:
        return []
    step_ms = d.breakdown.per_step_ms["step"]
    rows = ["", "| phase | share | ms/step | device ms/step |", "|---|---:|---:|---:|"]
    for key, share, busy in fmt.phase_parts(d):
        device = "-" if busy is None else fmt.ms(busy)
        rows.append(
            f"| {fmt.PHASE_LABEL[key]} | {fmt.pct(share)} | {share * step_ms:.2f} | {device} |"
        )
    if d.phases.unsplit:
        rows += ["", f"_not split: {text('; '.join(d.phases.unsplit))}_"]
    if d.modules is not None and d.modules.rows:
        rows += [
            "",
            f"_{text(d.modules.note)}_",
            "",
            "| " + " | ".join(fmt.MODULE_COLUMNS) + " |",
            "|---|" + "---:|" * (len(fmt.MODULE_COLUMNS) - 2) + "---|",
        ]
        for r in d.modules.rows[: fmt.MODULE_TOP]:
            cells = fmt.module_cells(r)
            name = "&nbsp;&nbsp;" * r.depth + code(cells[0].strip(), table=True)
            rows.append("| " + " | ".join([name, *(text(c) for c in cells[1:])]) + " |")
    return rows


def _findings(d: Diagnosis) -> list[str]:
    if not d.findings:
        return []
    out = ["", "**What to fix** (ranked by the most each can gain)", ""]
    mine = [f for f in d.findings if f.wall == d.verdict.wall]
    rest = [f for f in d.findings if f.wall != d.verdict.wall]
    for label, group in (("", mine), ("_Not your wall now:_", rest)):
        if label and group:
            out += ["", label, ""]
        for n, f in enumerate(group, 1):
            out += [
                f"{n}. **{text(f.title)}** — {text(fmt.gain(f, '×'))}  ",
                f"   evidence: {text(f.evidence)}  ",
                f"   fix: {text(f.fix)}",
            ]
    return out


def _memory(d: Diagnosis) -> list[str]:
    """The analysed device's memory peak, what is live then, growth and leaks, the memory
    findings with what each frees; other devices and notes as a list."""
    m = d.main_memory
    if d.memory is None or m is None:
        return []
    out = ["", f"#### Memory on {code(m.device)}", "", f"**peak {text(fmt.memory_peak(m))}**  "]
    capacity = fmt.memory_capacity(m)
    if capacity:
        out.append(f"capacity {text(capacity)}  ")
    out.append(f"at the peak: {text(fmt.memory_when(m))}")
    cats = fmt.memory_categories(m)
    if cats:
        out += ["", "| live at the peak | bytes | share |", "|---|---:|---:|"]
        out += [
            f"| {text(label)} | {fmt.size(n)} | {fmt.pct(share)} |" for _, label, n, share in cats
        ]
    if m.sites:
        out += ["", "| call site | category | bytes | blocks |", "|---|---|---:|---:|"]
        out += [
            f"| {code(s.site, table=True)} | "
            f"{text(fmt.MEMORY_CATEGORY_LABEL.get(s.category, s.category))} | "
            f"{fmt.size(s.bytes)} | {s.count} |"
            for s in m.sites[: fmt.MEMORY_TOP_SITES]
        ]
    lines = [f"- {text(line)}" for line in fmt.memory_growth_lines(m)]
    leak = fmt.memory_leak_line(m)
    if leak:
        lines.append(f"- ⚠️ **LEAK**: {text(leak)}")
        lines += [f"  - {text(site)}" for site in fmt.memory_leak_sites(m)]
    if lines:
        out += ["", *lines]
    if d.memory.findings:
        out += ["", "**Memory findings** (what each fix frees at the peak, at most)", ""]
        for n, f in enumerate(d.memory.findings, 1):
            out += [
                f"{n}. **{text(f.title)}** — {text(fmt.memory_saving(f))}  ",
                f"   evidence: {text(f.evidence)}  ",
                f"   fix: {text(f.fix)}",
            ]
    rest = [f"- other device {text(fmt.memory_device_line(o))}" for o in d.memory.devices[1:]]
    rest += [f"- _note:_ {text(n)}" for n in d.memory.notes]
    if rest:
        out += ["", *rest]
    return out


def _top(d: Diagnosis) -> list[str]:
    steps = max(d.steps.count, 1)
    if d.cpu is not None:
        title, what = "Top CPU ops", "op"
        rows = [(r.name, r.cls, r.count, r.share, r.time_s) for r in d.cpu.top_ops]
    else:
        title, what = "Top kernels by GPU time", "kernel"
        rows = [(k.name, k.cls, k.count, k.share, k.time_s) for k in d.kernels]
    if not rows:
        return []
    out = [
        "",
        f"<details><summary>{title}</summary>",
        "",
        f"| {what} | class | calls | share | ms/step |",
        "|---|---|---:|---:|---:|",
    ]
    out += [
        f"| {code(name, table=True)} | {text(cls)} | {count} | {fmt.pct(share)} "
        f"| {t * 1e3 / steps:.3f} |"
        for name, cls, count, share, t in rows[:TOP_KERNELS]
    ]
    out += ["", "</details>"]
    return out


def _mfu(d: Diagnosis) -> str:
    m = d.mfu
    if m.value is None:
        return f"**MFU** unknown — {text(m.basis)}"
    return (
        f"**MFU** {fmt.pct(m.value)} ({fmt.si(m.achieved_flops, 'FLOP/s')} of "
        f"{fmt.si(m.peak_flops, 'FLOP/s')} {m.dtype or ''} peak) — {text(m.basis)}"
    )


def render_counters_markdown(r: CounterReport) -> str:
    """A counters report (`wallfinder counters`) as Markdown: the estimates beside the
    counters (with a trace), each profiled launch's figures and bound (the measured points of
    a roofline: achieved AI and FLOP/s), the findings, the notes and the commands to collect
    more."""
    out = [
        f"### Hardware counters: {code(r.source)}",
        "",
        f"{r.page} page, {len(r.kernels)} launches; each launch's bound by its counters.",
    ]
    if r.checks:
        out += [
            "",
            "| kernel | launches | matched by | estimate | of roof | counters | status | detail |",
            "|---|---:|---|---|---:|---|---|---|",
        ]
        out += [
            f"| {code(fmt.short_kernel(c.kernel), table=True)} | {c.launches} | "
            f"{text(c.matched_by)} | {c.estimated_bound or '?'} | {fmt.pct(c.pct_of_roof, 0)} | "
            f"{c.counter_bound or '?'}{f' ({c.counter_unit})' if c.counter_unit else ''} | "
            f"{c.status} | {text(c.detail)} |"
            for c in r.checks
        ]
        out += [
            "",
            f"Matched {len(r.checks)} of the trace's top kernels; "
            f"{len(r.unmatched_kernels)} unmatched; {r.unmatched_launches} profiled launches "
            "matched no kernel of the trace.",
        ]
    out += [
        "",
        "| id | kernel | time | SM | memory | DRAM | L2 | AI (FLOP/B) | FLOP/s | occupancy "
        "| bound |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    out += [
        f"| {k.id} | {code(fmt.short_kernel(k.name), table=True)} | {fmt.duration(k.duration_s)} | "
        f"{fmt.pct(k.sm_pct, 0)} | {fmt.pct(k.memory_pct, 0)} | {fmt.pct(k.dram_pct, 0)} | "
        f"{fmt.pct(k.l2_pct, 0)} | {'?' if k.ai is None else f'{k.ai:.3g}'} | "
        f"{fmt.si(k.flops_per_s, 'FLOP/s')} | {fmt.pct(k.occupancy, 0)} | "
        f"{k.bound or '?'}{f' ({k.unit})' if k.unit and k.bound != 'latency' else ''} |"
        for k in r.kernels
    ]
    for f in r.findings:
        out += ["", f"- **{text(f.title)}**: {text(f.evidence)}. {text(f.fix)}."]
    out += [f"- note: {text(n)}" for n in r.notes]
    if r.collect:
        out += ["", "Collect the counters with (PROGRAM is your command):", "", "```sh"]
        out += [*r.collect, "```"]
    return "\n".join(out) + "\n"
