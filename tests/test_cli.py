"""The command line (`python -m specdemo generate`) as a shell user runs it, in a subprocess on the Shakespeare pair:
piped (no terminal, no colour) it prints the text the target kept, the same text as `--json` for the same seed;
`--rounds` lists the rounds with rejected drafts marked; in a terminal every round is shown inline in colour."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["generate", "--pair", "shakespeare", "--prompt", "ROMEO:\\n", "--max-new-tokens", "32", "--seed", "1",
        "--temperature", "0.8", "--k", "4"]
PROMPT = "ROMEO:\n"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    return e | {"HF_HUB_OFFLINE": "1"}


def cli(*extra: str) -> str:
    """stdout of the CLI with stdout piped (not a terminal)."""
    out = subprocess.run([sys.executable, "-m", "specdemo", *ARGS, *extra], cwd=ROOT, env=env(), check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=300)
    return out.stdout


def cli_in_terminal() -> str:
    """stdout of the CLI with stdout a pseudo-terminal."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "specdemo", *ARGS], cwd=ROOT, env=env(), stdout=slave,
                            stderr=subprocess.DEVNULL)
    os.close(slave)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 300)
            if not ready:
                raise TimeoutError("the CLI printed nothing for 300 s")
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        proc.wait(timeout=60)
    assert proc.returncode == 0
    return b"".join(chunks).decode().replace("\r\n", "\n")


@pytest.fixture(scope="module")
def trace() -> dict:
    return json.loads(cli("--json"))


def test_piped_output_is_the_text_the_target_kept(trace):
    out = cli()
    assert "\x1b[" not in out
    rejected = [t["text"] for r in trace["rounds"] for t in r["tokens"] if t["label"] == "rejected"]
    assert rejected, "the seed should give at least one rejected draft"
    assert out.startswith(f"--- sample 1 (seed 1) ---\n{PROMPT}{trace['text']}\n[fixed: 32 tokens in "), out
    assert "round 1:" not in out and "[-" not in out  # the rounds only when asked
    # the summary says the page's figures by the page's names: alpha (accepted / judged), tokens per target call
    m = trace["metrics"]
    assert (f"alpha {m['alpha_empirical']:.2f} (accepted / judged), {m['mean_accepted_length']:.2f} tokens per target "
            f"call, ") in out


def test_rounds_flag_marks_rejected_drafts(trace):
    out = cli("--rounds")
    assert out.startswith(f"--- sample 1 (seed 1) ---\n{PROMPT}{trace['text']}\n[rounds: ")
    lines = [line for line in out.splitlines() if line.startswith("round ")]
    assert len(lines) == len(trace["rounds"])
    kept = ""
    for line, rnd in zip(lines, trace["rounds"], strict=True):
        body = line.split(": ", 1)[1].rsplit("   (", 1)[0]
        for t in rnd["tokens"]:
            if t["label"] == "rejected":
                assert "[-" + t["text"].replace("\n", "\\n") + "-]" in body, (line, t)
        # without the rejected drafts and the marks, the rounds read as the text the target kept
        kept += re.sub(r"\[-.*?-\]", "", body).replace("{+", "").replace("+}", "").replace("{*", "").replace("*}", "")
        assert line.endswith(f"({rnd['caption']})")
    assert kept.replace("\\n", "\n") == trace["text"]


def test_terminal_output_stays_coloured_with_every_round_inline(trace):
    out = cli_in_terminal()
    assert "\x1b[31;9m" in out  # a rejected draft, red and struck through
    body = out.split("--- sample 1 (seed 1) ---\n", 1)[1].split("\n[fixed:", 1)[0]
    inline = "".join(t["text"] for r in trace["rounds"] for t in r["tokens"])
    assert ANSI.sub("", body) == PROMPT + inline
    assert "legend: " in out


def bench(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "specdemo", "bench", "--pair", "shakespeare", "--prompts", "1",
                          "--max-new-tokens", "8", *args], cwd=ROOT, env=env(), check=True, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, timeout=300)
    return out.stdout


def test_bench_times_every_method_side_by_side_and_its_figures_agree():
    """`bench --json` runs the strategy, target-only in each dtype and transformers' assisted generation in one
    process, and its ratios are the ratios of the rates it printed (no figure is taken from elsewhere)."""
    res = json.loads(bench("--k", "3", "--temperature", "0", "--strategy", "eagle", "--json"))
    tps = res["tokens_per_s"]
    assert {"naive", "speculative", "hf_assisted"} <= set(tps) and all(v > 0 for v in tps.values())
    assert res["settings"] == res["settings"] | {"k": 3, "strategy": "eagle", "prompts": 1, "max_new_tokens": 8}
    assert res["speedup_vs_naive"] == pytest.approx(tps["speculative"] / tps["naive"])
    assert res["speedup_vs_fastest_naive"] == pytest.approx(tps["speculative"] / max(
        v for m, v in tps.items() if m.startswith("naive")))
    assert 0 <= res["alpha_empirical"] <= 1 and res["c_isolated"] > 0


def test_bench_strategies_lists_every_strategy_of_the_pair(pair):
    from specdemo import SamplingConfig, SpecConfig
    from specdemo.engine.tree_drafter import run_tree_shape

    table = bench("--strategies", "--no-k-search", "--no-hf", "--k", "2")
    rows = {line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")}
    topk, depth, budget = run_tree_shape(SpecConfig(strategy="tree"), SamplingConfig(0.0), pair)  # the head's own shape at T = 0
    tree = f"tree {topk}x{depth} N={budget}"
    assert {"fixed K=2", "adaptive", "lookup K=8", "eagle K=2", tree} <= rows  # the head's chain and its tree
    assert not any(row.startswith("hf") for row in rows)  # --no-hf leaves transformers' modes out
    assert "general prompts" in table and "copy prompts" in table


def test_tree_prune_sets_the_trees_pruning_and_a_bad_one_is_refused_before_loading(capsys):
    """--tree-prune replaces the head's own threshold (the trace's settings say which ran; a lower one keeps more
    nodes); one outside [0, 1) is refused in one line, before any model loads."""
    from specdemo.__main__ import main

    runs = {}
    for prune in ("0", "0.3"):
        out = json.loads(cli("--strategy", "tree", "--tree-topk", "3", "--tree-depth", "3", "--tree-budget", "9",
                             "--tree-prune", prune, "--json"))
        assert out["settings"]["tree_prune_below"] == float(prune)
        runs[prune] = [r["k"] for r in out["rounds"] if r.get("tree")]
    assert sum(runs["0"]) / len(runs["0"]) > sum(runs["0.3"]) / len(runs["0.3"])  # nodes a round
    assert main(["generate", "--pair", "shakespeare", "--prompt", "x", "--strategy", "tree", "--tree-prune", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: tree_prune must be") and "\n" not in err


@pytest.mark.parametrize("pair_args,page_pair", [(["--pair", "gpt2"], "gpt2"),
                                                 (["--draft", "a/b", "--target", "c/d"], "custom")])
@pytest.mark.parametrize("strategy", ["eagle", "tree"])
def test_the_cli_and_the_page_refuse_a_head_strategy_alike(capsys, pair_args, page_pair, strategy):
    """One rule (strategy.check_head) for the strategies that draft with an EAGLE head: the CLI refuses them for a
    pair without one before any model loads, in the page's sentence (it used to call a preset without a head a
    custom pair)."""
    from specdemo.__main__ import main
    from specdemo.app.validation import UserError, validate

    with pytest.raises(UserError) as page:
        validate(page_pair, "a/b", "c/d", "x", 4, 0.0, 0, 1.0, 8, 0, False, 1.0, strategy=strategy)
    assert main(["generate", *pair_args, "--prompt", "x", "--strategy", strategy]) == 2
    assert capsys.readouterr().err.strip() == f"error: {page.value}"


def test_bench_races_decodings_side_by_side_with_a_ratio_per_row(pair):
    """`bench --strategies --decodings eager,static` times every specdemo row under both decodings in one run (the
    static caches sized to the run's longest request), transformers' rows once, and gives each row's static/eager
    ratio: the ratio of the two rates it printed, in the JSON and in the table."""
    from specdemo.bench.strategies_table import format_strategies

    res = json.loads(bench("--strategies", "--decodings", "eager,static", "--no-k-search", "--no-hf", "--k", "2",
                           "--json"))
    assert res["settings"]["decodings"] == ["eager", "static"]
    info = res["decoding_info"]
    assert info["eager"]["cache_tokens"] is None and info["static"]["cache_tokens"] >= res["settings"]["max_request"]
    for group, rows in res["groups"].items():
        methods = {r["method"] for r in rows.values()}
        assert {f"target-only {res['settings']['target_dtype']}", "fixed K=2", "adaptive", "lookup K=8",
                "eagle K=2"} <= methods and any(m.startswith("tree") for m in methods)
        assert len(rows) == 2 * len(methods)  # each under both decodings (and --no-hf: no transformers rows)
        for m in methods:
            eager, static = rows[f"{m} [eager]"], rows[f"{m} [static]"]
            assert (eager["decoding"], static["decoding"]) == ("eager", "static")
            assert static["vs_reference"] == pytest.approx(static["tokens_per_s"] / eager["tokens_per_s"])
            assert res["ratios"][group]["static"]["by_method"][m] == static["vs_reference"]
            assert 0 < static["tokens"] <= 8 * res["settings"][f"{group}_prompts"]  # the same prompts and budget
        fastest = max((r for r in rows if r.startswith("target-only")), key=lambda r: rows[r]["tokens_per_s"])
        assert res["fastest_target_only"][group] == fastest
        assert rows[fastest]["speedup_vs_fastest"] == 1.0
    table = format_strategies(res)
    assert "| method | eager tok/s | static tok/s | static / eager |" in table
    ratio = res["ratios"]["general"]["static"]["by_method"]["fixed K=2"]
    assert "| fixed K=2 [static] |" in table and f" | {ratio:.3f}x |" in table
    assert "static / eager: geometric mean" in table and "fastest target-only row of this run" in table


@pytest.mark.parametrize("extra,message", [
    (["--device", "foo"], "error: Unknown device 'foo': use cpu, cuda, cuda:N or mps."),
    (["--device", "cuda:7"], "error: The device cuda:7 is not available on this machine."),
    (["--seed", "-1"], "error: the seed must be between 0 and 9223372036854775807, got -1"),
    (["--seed", str(2**64)], "error: the seed must be between 0 and 9223372036854775807, got 18446744073709551616"),
])
def test_a_bad_device_or_seed_is_refused_in_one_line(capsys, extra, message):
    """Each used to end in a traceback: torch's device parser, CUDA's assertion on a CPU build, or the generator's
    overflow at the first round; and a negative seed ran as the seed 2**64 less it, silently."""
    from specdemo.__main__ import main

    assert main(["generate", "--pair", "shakespeare", "--prompt", "x", "--max-new-tokens", "2", *extra]) == 2
    assert capsys.readouterr().err.strip() == message


def test_bench_refuses_bad_decodings_before_loading(capsys):
    from specdemo.__main__ import main

    for extra in (["--decodings", "eager,static"], ["--strategies", "--decodings", "eager,fast"],
                  ["--strategies", "--decodings", "static,static"], ["--compiled"]):
        assert main(["bench", "--pair", "shakespeare", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --") and "\n" not in err


def test_bench_identity_checks_every_strategy_against_target_only():
    """`bench --identity`: at T = 0, every strategy of the pair against the project's own target-only, prompt by
    prompt, under the decoding asked; where static, its target-only against the eager one too."""
    res = json.loads(bench("--identity", "--decoding", "static", "--prompts", "2", "--json"))
    assert res["settings"]["decoding"] == "static" and res["settings"]["prompts"] == 2
    assert set(res["rows"]) == {"fixed K=4", "adaptive", "lookup K=8", "eagle K=4", "tree",
                                "target-only static vs eager"}
    for row in res["rows"].values():
        assert row["prompts"] == 2 and row["same"] + len(row["parted"]) == 2
        assert all(p["near_tie"] is not False for p in row["parted"])  # a parting that is no near-tie is a bug
    assert res["bugs"] == 0
