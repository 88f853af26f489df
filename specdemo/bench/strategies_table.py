"""The table of the strategies benchmark (`bench --strategies`, run by strategies.run_strategies): the run's settings,
its decodings and isolated costs, then for each prompt group a row a strategy (tokens/s, speedups, target calls,
acceptance, c in the loop against c in isolation, the verify cost, the share of the ceiling E / (cK + v)), the
decodings side by side where several raced, and each strategy against its transformers equivalent. No timing.
"""

from __future__ import annotations

from .decodings import decoding_line
from .strategies import HF_COMPILED, SLOW_ROUND


def format_strategies(res: dict) -> str:
    """run_strategies' result as text: the settings and costs, then each prompt group (group_lines)."""
    s = res["settings"]
    modes = s.get("decodings") or [None]
    multi = len(modes) > 1
    lines = [f"pair {res['pair']['name']} on {res['pair']['device']} ({s['threads']} threads), draft "
             f"{s['draft_dtype']}, target {s['target_dtype']}; T={s['temperature']}, top-k={s['top_k']}, "
             f"top-p={s['top_p']}, {s['max_new_tokens']} new tokens; hf K={s['k']}, lookup K={s['lookup_k']}, "
             f"n-gram <= {s['ngram']}"]
    if multi:
        lines.append(f"decodings {', '.join(modes)}: every specdemo row under each, back to back on every prompt, "
                     f"who goes first turning prompt by prompt; ratios against {modes[0]}")
    lines += [decoding_line(info) for info in (res.get("decoding_info") or {}).values()]
    lines += captures_lines(s.get("captures"))
    lines += isolated_lines(res, modes)
    hc = res.get("hf_compiled")
    if hc:
        lines.append(compiled_line(hc))
    for group, rows in res["groups"].items():
        lines += group_lines(res, group, rows, modes)
    return "\n".join(lines)


def captures_lines(c: dict | None) -> list[str]:
    """The graphs captured on first use (Race.time_groups): in the warm-up, and while timing (none in a steady
    state). Nothing where no graph was captured (eager and static decodings)."""
    if not c or not (c["warm_up"] or c["timed"]):
        return []
    return [f"graphs captured on first use: {c['warm_up']} in the warm-up ({c['warm_up_s']:.2f} s"
            + ("; every specdemo row warmed on every prompt" if c["every_prompt_warmed"] else "")
            + f"), {c['timed']} while timing ({c['timed_s']:.2f} s)"]


def isolated_lines(res: dict, modes: list) -> list[str]:
    """The isolated costs (hot, median), a line per decoding: a draft step, the head's step, a target step in each
    dtype, each verify."""
    multi = len(modes) > 1
    lines = []
    for d, iso in (res.get("isolated_by_decoding") or {modes[0]: res["isolated"]}).items():
        lines.append("isolated{} (hot, median): draft step {:.2f} ms{}; target step {}; verify {}".format(
            f" [{d}]" if multi else "", iso["draft_ms"],
            f", EAGLE head step {iso['head_ms']:.2f} ms" if iso.get("head_ms") else "",
            ", ".join(f"{dt} {v:.2f} ms" for dt, v in iso["target_ms"].items()),
            ", ".join(f"{int(kk) + 1} tokens {v:.2f} ms" for kk, v in iso["verify_ms"].items())))
    return lines


def compiled_line(hc: dict) -> str:
    """transformers' compiled row (CompiledGenerate.describe, or CompiledApart's from its own process): how it
    compiled, and its compile seconds (per prompt length where it ran apart) or why it was left out."""
    if "compile_config" not in hc:
        return f"{HF_COMPILED}: left out: {hc.get('error')}"
    cc = hc["compile_config"]
    head = (f"{HF_COMPILED}: generate(cache_implementation=\"static\") with CompileConfig(fullgraph="
            f"{cc['fullgraph']}, mode={cc['mode']!r})" + (" on a plain copy of the target (unpacked "
            "linears)" if hc["plain_copy"] else ""))
    if hc["error"]:
        return head + f"; left out: {hc['error']}"
    if hc.get("own_process"):
        return head + ("; in a process of its own, warmed on each prompt length before its timed runs; compile, "
                       "not timed in the row: " + ", ".join(f"{n} tokens {v:.1f} s"
                                                            for n, v in hc["compile_s_by_length"].items()))
    return head + (f"; compile and warm-up, not timed in the row: first call {hc['compile_s']:.1f} s, then "
                   + ", ".join(f"{v:.1f} s" for v in hc["warmup_s"][1:]))


def group_lines(res: dict, group: str, rows: dict, modes: list) -> list[str]:
    """One prompt group: what its speedups are against, its table, the decodings side by side (several) and the
    comparisons of the strategies with their transformers equivalents."""
    s = res["settings"]
    n = s["general_prompts"] if group == "general" else s["copy_prompts"]
    fastest = (res.get("fastest_target_only") or {}).get(group)
    lines = ["", f"{group} prompts ({n}):", ""]
    if fastest:
        lines += [(f"speedup (same dtype): against target-only {s['target_dtype']} under the row's decoding; "
                   f"speedup (fastest target-only): against the fastest target-only row of this run, {fastest} "
                   f"({rows[fastest]['tokens_per_s']:.1f} tok/s)"), ""]
    lines += table_lines(rows) + uneven_lines(rows)
    if len(modes) > 1:
        lines += ratio_lines(rows, modes, (res.get("ratios") or {}).get(group) or {})
    return lines + comparison_lines(rows, modes[0])


def table_lines(rows: dict) -> list[str]:
    """A group's table: a row a method (and decoding), the rates, speedups, target calls and the paper's
    quantities where the row drafts."""
    lines = ["| method | tokens/s | speedup (same dtype) | speedup (fastest target-only) | target calls | "
             "acceptance | tokens/round | c loop / isolated | v | % of E/(cK+v) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m, r in rows.items():
        cells = [m, f"{r['tokens_per_s']:.1f}", f"{r['speedup_same_dtype']:.2f}x", f"{r['speedup_vs_fastest']:.2f}x",
                 str(r["target_calls"]), f"{r['acceptance_rate']:.2f}" if "acceptance_rate" in r else "",
                 f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else ""]
        if "c_loop" in r:
            c_iso = f"{r['c_isolated']:.3f}" if r["c_isolated"] else "-"
            cells += [f"{r['c_loop']:.3f} / {c_iso}", f"{r['verify_cost']:.2f}",
                      f"{100 * r['fraction_of_ceiling']:.0f}%"]
        else:
            cells += ["", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


UNEVEN = 0.5  # a prompt run at under this share of its row's rate is named


def uneven_lines(rows: dict) -> list[str]:
    """The rows with a prompt run at under UNEVEN of the row's rate (the H200's tree ran one copy prompt at a
    quarter of its rate on 2026-11-28), each with how its rounds spread (strategies.round_spread). A few slow rounds
    alone are not named: on a shared CPU they come and go with the machine's load. Nothing where none."""
    lines = []
    for m, r in rows.items():
        rates = r.get("prompt_rates") or []
        if not rates or min(rates) >= UNEVEN * r["tokens_per_s"]:
            continue
        i = rates.index(min(rates))
        line = f"uneven: {m}: prompt {i + 1} at {rates[i]:.1f} tok/s ({rates[i] / r['tokens_per_s']:.2f}x the row's)"
        if "round_ms_median" in r:
            line += (f"; its rounds: median {r['round_ms_median']:.2f} ms, the slowest {r['round_ms_max']:.2f} ms, "
                     f"{r['slow_rounds']} over {SLOW_ROUND:g}x the median ({100 * r['slow_share']:.0f}% of their time)")
        lines.append(line)
    return [""] + lines if lines else []


def comparison_lines(rows: dict, reference: str | None) -> list[str]:
    """Under the `reference` decoding (and transformers' rows): adaptive against the best fixed K and against
    transformers' default assisted generation, lookup against transformers' prompt lookup, where both ran."""
    lines = []
    by_method = {r.get("method", m): r for m, r in rows.items() if r.get("decoding") in (None, reference)}
    fixed = {m: r["tokens_per_s"] for m, r in by_method.items() if m.startswith("fixed")}
    if fixed and "adaptive" in by_method:
        best = max(fixed, key=fixed.get)
        lines.append("")
        lines.append(f"adaptive / best fixed ({best}): {by_method['adaptive']['tokens_per_s'] / fixed[best]:.3f}")
    if "hf assisted default" in by_method and "adaptive" in by_method:
        ratio = by_method["adaptive"]["tokens_per_s"] / by_method["hf assisted default"]["tokens_per_s"]
        lines.append(f"adaptive / transformers default assisted: {ratio:.2f}x")
    look = next((m for m in by_method if m.startswith("lookup")), None)
    hf_look = next((m for m in by_method if m.startswith("hf prompt lookup")), None)
    if look and hf_look:
        lines.append(f"lookup / transformers prompt lookup: "
                     f"{by_method[look]['tokens_per_s'] / by_method[hf_look]['tokens_per_s']:.2f}x")
    return lines


def ratio_lines(rows: dict, modes: list[str], summary: dict) -> list[str]:
    """The decodings side by side, method by method: each one's tokens/s and each later one's ratio to the first's,
    then their geometric mean, lowest and highest."""
    ref = modes[0]
    methods = list(dict.fromkeys(r["method"] for r in rows.values() if r["decoding"] is not None))
    rate = {(r["method"], r["decoding"]): r["tokens_per_s"] for r in rows.values()}
    lines = ["", "decodings side by side (the same prompts, alternated prompt by prompt):", "",
             "| method | " + " | ".join(f"{d} tok/s" for d in modes) + " | "
             + " | ".join(f"{d} / {ref}" for d in modes[1:]) + " |",
             "|---|" + "---:|" * (2 * len(modes) - 1)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(f"{rate[m, d]:.1f}" for d in modes) + " | "
                     + " | ".join(f"{rate[m, d] / rate[m, ref]:.3f}x" for d in modes[1:]) + " |")
    lines.append("")
    for d, sm in summary.items():
        r = sm["by_method"]
        lines.append(f"{d} / {ref}: geometric mean {sm['geometric_mean']:.3f}x over {len(r)} rows, lowest "
                     f"{r[sm['lowest']]:.3f}x ({sm['lowest']}), highest {r[sm['highest']]:.3f}x ({sm['highest']})")
    return lines
