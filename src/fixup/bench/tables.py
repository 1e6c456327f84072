"""The benchmark's results as tables (plain text or Markdown): what ``fixup bench`` prints.

Each takes the dict :func:`fixup.bench.speed.benchmark` returns (or its JSON, read back).
"""

from __future__ import annotations

from typing import Any

__all__ = ["format_modes", "format_table"]


def _cell(ratio: dict[str, float] | None) -> str:
    return "-" if ratio is None else f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})"


def _render(head: list[str], body: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in body]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return ["  ".join(x.ljust(w) for x, w in zip(row, widths)) for row in [head, *body]]


def _footer(result: dict[str, Any]) -> str:
    env, targets = result["environment"], result["targets"]
    return (f"\ntorch {env['torch']}, {env['cpus']} CPUs, load average {env['load_average']}; x = ratio to the "
            f"bare network (norm none) of the same family in the same mode. Targets: step <= {targets['step']}, "
            f"memory <= {targets['memory']}, folded forward <= {targets['folded_forward']}. "
            f"Memory: {result['memory_method']}.")


def format_table(result: dict[str, Any], markdown: bool = False) -> str:
    """The rows as a table: times and ratios to the bare network of the same family; misses marked."""
    head = ["family", "mode", "threads", "variant", "step ms", "step x (min-max)", "fastest x", "x eager",
            "fwd ms", "fwd x (min-max)", "peak MiB", "mem x", "misses"]
    body = []
    for r in result["rows"]:
        step, ratio, mode_ratio = r.get("step_ms"), r.get("step_ratio"), r.get("mode_ratio")
        body.append([r["family"], r["mode"], str(r["threads"]), r["label"],
                     "-" if step is None else f"{step['median']:.1f}", _cell(ratio),
                     "-" if ratio is None else f"{ratio['fastest']:.2f}",
                     "-" if mode_ratio is None else f"{mode_ratio['fastest']:.2f}",
                     f"{r['forward_ms']['median']:.1f}" if "forward_ms" in r else "-", _cell(r.get("forward_ratio")),
                     f"{r['peak_bytes'] / 2**20:.1f}" if "peak_bytes" in r else "-",
                     f"{r['peak_ratio']:.2f}" if "peak_ratio" in r else "-", ", ".join(r["misses"]) or "-"])
    lines = _render(head, body, markdown)
    reasons = [f"- {r['family']} {r['mode']} {r['threads']} thread(s) {r['label']}: {r['reason']}"
               for r in result["rows"] if r.get("reason")]
    if reasons:
        lines += ["", "Where the difference goes (torch.profiler, self CPU time or memory, vs the bare network):",
                  *reasons]
    lines.append(_footer(result) + " Fastest x: ratio of the fastest repetitions; x eager: the same variant's "
                 "eager float32 step (fastest repetitions).")
    return "\n".join(lines)


def format_modes(result: dict[str, Any], markdown: bool = False) -> str:
    """The modes side by side: one line per family, thread count and variant; per mode the training step's
    ratio to the bare network in that mode (fastest repetitions) and, past eager, its ratio to its own eager
    float32 step."""
    modes = list(dict.fromkeys(r["mode"] for r in result["rows"]))
    cells: dict[tuple, dict[str, dict]] = {}
    for r in result["rows"]:
        if "step_ratio" in r:
            cells.setdefault((r["family"], r["threads"], r["label"]), {})[r["mode"]] = r
    head = ["family", "threads", "variant"]
    for m in modes:
        head += [f"{m} ms", f"{m} x bare"] + ([] if m == "eager" else [f"{m} x eager"])
    body = []
    for (family, threads, label), by_mode in cells.items():
        line = [family, str(threads), label]
        for m in modes:
            r = by_mode.get(m)
            line += ["-", "-"] if r is None else [f"{r['step_ms']['min']:.1f}", f"{r['step_ratio']['fastest']:.2f}"]
            if m != "eager":
                line.append("-" if r is None or r.get("mode_ratio") is None else f"{r['mode_ratio']['fastest']:.2f}")
        body.append(line)
    note = _footer(result) + " Training step, fastest repetition (ms) and ratios of the fastest repetitions."
    return "\n".join([*_render(head, body, markdown), note])
