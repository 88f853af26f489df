"""The graphs' stand-in on a CPU (models/stand_in.py) keeps a CUDA graph's contract: Python runs once, at record
time; the same buffers are read and written at every replay; and what a capture would refuse fails the record,
naming the line. Then every captured part of every strategy's round records without such a hazard."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.speculative import speculative_rounds
from specdemo.models.stand_in import CaptureHazard, ReplayStandIn
from specdemo.models.static_parts import Tally
from test_static import STRATEGIES, cuda_pair, decode_as, own_pair  # noqa: F401 - fixtures

torch.manual_seed(0)


def test_a_replay_reads_the_buffers_of_now_and_the_host_values_of_its_record():
    """As a CUDA graph: a buffer read from outside is read again at each replay (and a buffer written, written
    again), while a host int, a shape or a branch taken in Python stays what it was when the forward was recorded."""
    buf, written, host = torch.arange(4.0), torch.zeros(4), {"n": 2}

    def forward():
        written.copy_(buf * host["n"])
        return (buf[: host["n"]] + 1, written.sum() if host["n"] > 1 else written.mean())

    graph = ReplayStandIn(forward)
    head, total = graph.out
    assert torch.isnan(head).all() and torch.isnan(total), "as a CUDA capture, which runs nothing"
    graph.replay()
    assert head.tolist() == [1.0, 2.0] and total.item() == 12.0
    buf.fill_(10.0)
    host["n"] = 3  # the replay never sees this
    graph.replay()
    assert written.tolist() == [20.0] * 4, "the buffer written again, with the recorded factor 2"
    assert head.tolist() == [11.0, 11.0], "the recorded slice [:2], into the recorded output tensor"
    assert total.item() == 80.0, "the recorded branch: the sum, not the mean"


def test_intermediates_are_made_again_and_in_place_writes_reach_the_buffers():
    cache, pos = torch.zeros(2, 6), torch.zeros((), dtype=torch.long)

    def forward():
        rows = torch.stack([pos, pos + 1]) + 1  # made inside: made again at each replay
        cache.index_copy_(1, rows, torch.ones(2, 2, device=cache.device) * rows.float())
        top = cache.topk(2, dim=1)  # a tuple result, read by place
        return top.values, top.indices

    graph = ReplayStandIn(forward)
    pos.fill_(3)
    graph.replay()
    assert cache[0].tolist() == [0.0, 1.0, 2.0, 0.0, 4.0, 5.0], "the record's columns 1, 2, then the replay's 4, 5"
    values, indices = graph.out
    assert values[0].tolist() == [5.0, 4.0] and indices[0].tolist() == [5, 4]


@pytest.mark.parametrize("body,why", [
    (lambda x, m: x.sum().item(), "reads the device.s values on the host"),
    (lambda x, m: x.tolist(), "Tensor.tolist reads"),
    (lambda x, m: x * 2 if bool(x.sum() > 0) else x, "reads the device's values on the host"),
    (lambda x, m: x[m], "boolean mask"),
    (lambda x, m: m.nonzero(), "reads the device's values on the host"),
    (lambda x, m: x.repeat_interleave(torch.tensor(2)), "host data|output_size"),
    (lambda x, m: m.clone().__setitem__(0, True), "copies a host value in"),
    (lambda x, m: x + torch.tensor([1.0, 2.0, 3.0]), "copies host data in"),
    (lambda x, m: x + torch.rand(3), "draws random numbers"),
    (lambda x, m: torch.multinomial(x + 1, 1), "draws random numbers"),
    (lambda x, m: torch.bincount(m.long()), "reads the device's values on the host"),
    (lambda x, m: x + torch.tensor(2.0, device=x.device), "copies host data in"),
    (lambda x, m: (torch.arange(3) == 0) | m, "makes a tensor on the host"),
    (lambda x, m: x + torch.zeros(3, dtype=x.dtype), "makes a tensor on the host"),
    (lambda x, m: torch.full((3,), 1.0) * x, "makes a tensor on the host"),
    (lambda x, m: x.cpu() + 1, "moves a tensor between the host and the device"),
    (lambda x, m: x.to("cpu") + 1, "moves a tensor between the host and the device"),
], ids=["item", "tolist", "bool", "mask-index", "nonzero", "repeat-interleave", "setitem-scalar", "tensor-from-list",
        "rand", "multinomial", "bincount", "tensor-from-scalar", "arange-on-host",
        "zeros-on-host", "full-on-host", "cpu", "to-cpu"])
def test_what_a_capture_would_refuse_fails_the_record_and_names_its_line(body, why):
    x, m = torch.arange(3.0), torch.tensor([True, False, True])
    with pytest.raises(CaptureHazard, match=why) as err:
        ReplayStandIn(lambda: body(x, m))
    assert "tests/test_stand_in.py:" in str(err.value) and "body(x, m)" not in str(err.value), "its own line"


def test_a_librarys_tensors_made_on_the_host_pass_but_its_host_values_copied_in_do_not():
    """A library's code (transformers') may make a tensor without device=, as its captures on the H200 did: the
    stand-in lets it. A host value it copies into a device tensor, through a cast too, still fails the record."""
    def library(source: str):
        return eval(compile(source, os.path.join(os.sep, "usr", "lib", "python3", "somelib.py"), "eval"),
                    {"torch": torch})

    x = torch.arange(3.0)
    made = library("lambda x: x + torch.zeros(3)")
    graph = ReplayStandIn(lambda: made(x))
    x.fill_(1.0)
    graph.replay()
    assert graph.out.tolist() == [1.0, 1.0, 1.0]
    cast = library("lambda x: x.clone().__setitem__(0, torch.tensor(5).float())")
    with pytest.raises(CaptureHazard, match="copies a host value in") as err:
        ReplayStandIn(lambda: cast(x))
    assert "somelib.py:1" in str(err.value)


def test_out_arguments_and_other_threads_are_handled_as_on_cuda():
    """An `out=` buffer written twice replays both writes; a host read in another thread while one records is that
    thread's own business (only the recording thread is refused)."""
    import threading

    x, buf, host_read = torch.arange(3.0), torch.zeros(3), []

    def forward():
        torch.add(x, 1, out=buf)
        torch.mul(buf, 2, out=buf)
        reader = threading.Thread(target=lambda: host_read.append(x.tolist()))
        reader.start()
        reader.join()
        return (buf * 1,)

    graph = ReplayStandIn(forward)
    assert host_read == [[0.0, 1.0, 2.0]]
    x.fill_(1.0)
    graph.replay()
    assert buf.tolist() == [4.0] * 3 and graph.out[0].tolist() == [4.0] * 3
    assert torch.arange(2).tolist() == [0, 1], "tolist reads again once no thread records"


def test_a_record_runs_the_forward_as_often_as_a_captures_warm_ups():
    """cuda_graph runs a forward twice before its capture (which executes nothing), and a row move's once: a forward
    whose effects add up shows them as often here."""
    for warmups in (1, 2):
        counter = torch.zeros(())
        graph = ReplayStandIn(lambda: (counter.add_(1) * 1,), warmups)
        assert counter.item() == warmups
        graph.replay()
        assert counter.item() == warmups + 1 and graph.out[0].item() == warmups + 1


def test_a_replay_spoils_what_graphs_captured_after_it_in_its_pool_made():
    """CUDA graphs that share a pool are safe replayed in capture order: a later capture may keep its outputs where
    an earlier one's intermediates were. specdemo captures on first use, in any order, so its code reads a graph's
    outputs before an earlier-captured graph of the pool replays; the stand-in spoils them at such a replay, so
    that code breaking the rule gives wrong tokens on a CPU too. A capture runs nothing, so a graph's outputs are
    spoilt until its first replay. Tensors from outside that a graph returns (or views of them), and graphs of
    other pools, are left alone."""
    from specdemo.models.stand_in import StandInPool

    x, kept = torch.arange(3.0), torch.zeros(3)
    pool = StandInPool()
    writer = ReplayStandIn(lambda: kept.add_(0), pool=pool)  # makes nothing (writes a buffer): still spoils later ones
    first = ReplayStandIn(lambda: x + 1, pool=pool)
    middle = ReplayStandIn(lambda: x + 2, pool=pool)

    def forward():
        flags = x > 1  # returned twice: spoilt once
        return x * 2, (x > 0).long(), flags, kept.copy_(x), kept[1:], flags

    second = ReplayStandIn(forward, pool=pool)
    alone = ReplayStandIn(lambda: x - 1)
    assert torch.isnan(second.out[0]).all() and torch.isnan(alone.out).all(), "nothing until the first replay"
    for graph in (writer, first, middle, second, alone):  # in capture order: nothing is spoilt
        graph.replay()
    writer.replay()
    assert torch.isnan(second.out[0]).all() and torch.isnan(first.out).all()
    for graph in (first, middle, second):
        graph.replay()
    assert second.out[0].tolist() == [0.0, 2.0, 4.0] and second.out[1].tolist() == [0, 1, 1]
    first.replay()
    middle.replay()  # two earlier graphs replay: the flags stay flipped, not flipped back
    doubled, positive, above, copied, view, again = second.out
    assert torch.isnan(doubled).all() and (positive == torch.iinfo(torch.long).max).all()
    assert above.tolist() == [True, True, False] and again is above, "flags flipped once"
    assert copied is kept and copied.tolist() == [0.0, 1.0, 2.0] and view.tolist() == [1.0, 2.0], "outside: kept"
    assert first.out.tolist() == [1.0, 2.0, 3.0] and middle.out.tolist() == [2.0, 3.0, 4.0]
    assert alone.out.tolist() == [-1.0, 0.0, 1.0], "another pool"
    second.replay()
    assert second.out[0].tolist() == [0.0, 2.0, 4.0] and above.tolist() == [False, False, True], "written again"


def test_outputs_a_replay_could_not_copy_into_are_refused():
    x = torch.arange(3.0)
    with pytest.raises(ValueError, match="overlap"):
        ReplayStandIn(lambda: ((x * 2).expand(4, 3),))
    with pytest.raises(TypeError, match="returns tensors"):
        ReplayStandIn(lambda: (x * 2, 3))


def test_a_tensor_without_storage_from_outside_records():
    """oneDNN's packed bf16 weights (devices.pack_weight, on a CPU with bf16 units) have no storage of their own; a
    forward that reads one records and replays (SmolLM2's stand-in failed on them once)."""
    w = torch.randn(2, 2).to_mkldnn()
    graph = ReplayStandIn(lambda: w.to_dense() * 2)
    graph.replay()
    assert torch.equal(graph.out, w.to_dense() * 2)


def test_their_capturable_spellings_record():
    x, m, buf = torch.arange(3.0), torch.tensor([True, False, True]), torch.empty(3)

    def forward():
        flags = m.clone()
        flags[0].fill_(False)  # not flags[0] = False
        flags[1:] = True  # a slice is filled on the device, no copy
        kept = torch.where(flags, x, 0.0)  # not x[flags]
        torch.ones(3, out=buf)  # a factory into a buffer on the device
        return kept + buf, (torch.arange(3, device=x.device) == 0) | flags, x.repeat_interleave(2, output_size=6)

    graph = ReplayStandIn(forward)
    graph.replay()
    assert graph.out[0].tolist() == [1.0, 2.0, 3.0] and graph.out[1].tolist() == [True, True, True]


def every_setting(temperature: float) -> tuple[SamplingConfig, list[SpecConfig]]:
    """The sampling at `temperature` and the runs that exercise every captured part: each strategy, and trees pruned
    and unpruned, with top-k children and (at T > 0) sampled ones."""
    sampling = SamplingConfig(temperature, top_k=20, top_p=0.95) if temperature else SamplingConfig(0.0)
    specs = [SpecConfig(k=4, max_new_tokens=24, strategy=s, top_candidates=3) for s in STRATEGIES]
    specs += [SpecConfig(k=4, max_new_tokens=24, strategy="tree", tree_topk=3, tree_depth=4, tree_budget=10,
                         tree_prune=prune, tree_children=children, top_candidates=3)
              for prune in (0.0, 0.05) for children in (("top", "sampled") if temperature else ("top",))]
    return sampling, specs


def runs_without_a_fallback(pair, caplog, temperature: float) -> None:
    """Every strategy, and trees pruned and unpruned with top-k and sampled children, on a pair whose forwards are
    captured (or recorded by the stand-in): no captured part falls back to its step-by-step path (each logs 'could
    not be captured' when it does), and a setting's second run replays what its first captured."""
    sampling, specs = every_setting(temperature)
    with caplog.at_level(logging.WARNING):
        for spec in specs:
            rounds = list(speculative_rounds(pair, pair.encode("ROMEO:\nWhat light"), sampling, spec))
            assert sum(len(r.tokens) for r in rounds) >= 24, spec.strategy
    fallbacks = [r.getMessage() for r in caplog.records if "could not be captured" in r.getMessage()]
    assert not fallbacks, fallbacks
    slot = pair.static_slots["head"]
    assert getattr(slot, "trees", None) and getattr(slot, "chains", None), "trees and chains were replayed"
    made = Tally.count
    list(speculative_rounds(pair, pair.encode("ROMEO:\nWhat light"), sampling, specs[-1]))
    assert Tally.count == made, "a setting's second run replays the graphs its first run captured"


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_every_strategys_captured_parts_record_without_a_hazard(own_pair, caplog, temperature):  # noqa: F811
    """On the stand-in. The tree's walk once set its root with `on_path[0] = True`, a host scalar's copy that a CUDA
    capture refuses: this test caught it."""
    decode_as(own_pair, "replayed")
    runs_without_a_fallback(own_pair, caplog, temperature)


@pytest.mark.cuda
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_on_cuda_every_strategys_captured_parts_capture(cuda_pair, caplog, temperature):  # noqa: F811
    """The same on a GPU, where a capture that fails says why in its warning (scripts/gpu_bench.sh runs it)."""
    assert cuda_pair.decoding == "graphs", cuda_pair.decoding_note
    runs_without_a_fallback(cuda_pair, caplog, temperature)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_no_round_copies_python_values_in_but_through_upload_ids(own_pair, temperature):  # noqa: F811
    """On a GPU, `torch.tensor(ids, device=...)` copies from pageable memory and so waits for the GPU, as a read
    does. After the prompt's round, no round of any setting makes a tensor from Python values outside
    `devices.upload_ids` (pinned memory and a copy that does not wait, on CUDA). Each round used to make one, the
    kept tokens appended to the sequence; an eager tree's row moves made one per layer and cache."""
    from specdemo.bench.round_ops import round_syncs

    decode_as(own_pair, "replayed")
    sampling, specs = every_setting(temperature)
    for spec in specs:  # a first run captures (and copies a tree's first pack in, once)
        list(speculative_rounds(own_pair, own_pair.encode("ROMEO:\nWhat light"), sampling, spec))
        rounds = round_syncs(speculative_rounds(own_pair, own_pair.encode("ROMEO:\nWhat light"), sampling, spec),
                             own_pair.device)
        assert rounds and not any(uploads for _, uploads in rounds), (spec, rounds)
    decode_as(own_pair, "eager")  # the step-by-step tree and its row moves
    spec = SpecConfig(k=4, max_new_tokens=24, strategy="tree", tree_topk=3, tree_depth=4, tree_budget=10)
    rounds = round_syncs(speculative_rounds(own_pair, own_pair.encode("ROMEO:\nWhat light"), sampling, spec),
                         own_pair.device)
    assert not any(u for _, uploads in rounds for u in uploads if "lm.py" in u), rounds


@pytest.mark.cuda
@pytest.mark.parametrize("strategy", ["fixed", "lookup", "eagle", "tree"])
def test_on_cuda_a_captured_round_synchronizes_once(cuda_pair, strategy):  # noqa: F811
    """Issue 45, item 3, as CUDA sees it (torch.cuda.set_sync_debug_mode, which sees C++'s syncs too: a copy from
    pageable memory; a capture's device synchronize, which that mode misses, is counted by round_syncs from the
    graphs made): after a first run, whose captures synchronize, every round after the prompt's synchronizes once,
    at its verdict's read. A failure names the lines."""
    from specdemo.bench.round_ops import round_syncs

    assert cuda_pair.decoding == "graphs", cuda_pair.decoding_note
    for temperature in (0.0, 0.7):
        spec, ids = SpecConfig(k=4, max_new_tokens=32, strategy=strategy), cuda_pair.encode("ROMEO:\nWhat light")
        list(speculative_rounds(cuda_pair, ids, SamplingConfig(temperature), spec))
        rounds = round_syncs(speculative_rounds(cuda_pair, ids, SamplingConfig(temperature), spec), cuda_pair.device)
        assert rounds and all(len(syncs) == 1 for syncs, _ in rounds), (temperature, rounds)


def test_the_bench_times_replays_only_where_graphs_are_captured_on_first_use(own_pair):  # noqa: F811
    """On CUDA (and on the stand-in) the drafting and the verdicts are captured on first use, per cache bucket and
    plan, so a prompt that runs longer than the warm-up's would capture inside its timing. The bench then warms
    every specdemo row on every prompt, and the timed runs capture nothing; eager decoding needs no such pass."""
    from specdemo.bench.strategies import run_strategies
    from specdemo.bench.strategies_table import format_strategies

    decode_as(own_pair, "replayed")
    res = run_strategies(own_pair, SamplingConfig(0.7), k=3, max_new_tokens=24, n_prompts=1, k_search=False,
                         include_hf=False, log=lambda *a: None)
    c = res["settings"]["captures"]
    assert c["every_prompt_warmed"] and c["warm_up"] > 0 and c["timed"] == 0, c
    assert f"graphs captured on first use: {c['warm_up']} in the warm-up" in format_strategies(res)
    # the verify's cost at each captured width a tree pads to (16 and 32 rows here), for the CUDA tree's rule
    assert {15, 31} <= set(res["isolated"]["verify_ms"]), res["isolated"]["verify_ms"]
    assert "16 tokens" in format_strategies(res) and "32 tokens" in format_strategies(res)
    # the caches' size it prints is the target's, not the head's (which keeps room for a tree besides)
    slots = own_pair.static_slots
    assert next(iter(res["decoding_info"].values()))["cache_tokens"] == slots["target"].max_len < slots["head"].max_len
    decode_as(own_pair, "eager")
    res = run_strategies(own_pair, SamplingConfig(0.7), k=3, max_new_tokens=24, n_prompts=1, k_search=False,
                         include_hf=False, log=lambda *a: None)
    c = res["settings"]["captures"]
    assert not c["every_prompt_warmed"] and c["warm_up"] == c["timed"] == 0, c
    assert "graphs captured" not in format_strategies(res) and not {15, 31} & set(res["isolated"]["verify_ms"])
    # each row's rate on each prompt, and how its rounds spread: an uneven row is named under its table
    for group, n in (("general", 1), ("copy", res["settings"]["copy_prompts"])):
        for name, row in res["groups"][group].items():
            rates = row["prompt_rates"]
            assert len(rates) == n and min(rates) * 0.999 <= row["tokens_per_s"] <= max(rates) * 1.001, (name, row)
            if "c_loop" in row and "round_ms_median" in row:
                assert 0 < row["round_ms_median"] <= row["round_ms_max"] and row["slow_rounds"] >= 0
    copy_rows = res["groups"]["copy"]
    for row in copy_rows.values():
        row["prompt_rates"], row["slow_rounds"] = [row["tokens_per_s"]] * len(row["prompt_rates"]), 0
    assert "uneven:" not in format_strategies(res)
    name = next(m for m, r in copy_rows.items() if "round_ms_median" in r)
    row = copy_rows[name]
    row["prompt_rates"][2], row["slow_rounds"], row["slow_share"] = 0.25 * row["tokens_per_s"], 3, 0.4
    line = next(x for x in format_strategies(res).splitlines() if x.startswith("uneven:"))
    assert line.startswith(f"uneven: {name}: prompt 3 at {0.25 * row['tokens_per_s']:.1f} tok/s (0.25x the row's); "
                           f"its rounds: median {row['round_ms_median']:.2f} ms"), line
    assert line.endswith(", 3 over 3x the median (40% of their time)"), line


def test_a_failed_capture_of_the_heads_read_leaves_the_run_its_own_positions(own_pair, monkeypatch):  # noqa: F811
    """A capture writes through the head cache's scratch view, after saving the run's positions (HeadSlot.take).
    When the read's capture failed, the run read eagerly over what the capture had left there: that round's drafts
    came from another context (found by reading, 2026-11-28). The run after a failed capture must draft as a run
    whose reads were eager from the start."""
    from specdemo.models.head_graphs import HeadSlot

    def failing(self, n, b):
        self.take(self.scratch)
        self.cache.k.normal_()  # what a capture's warm-ups may leave in the slots
        self.cache.v.normal_()
        raise RuntimeError("a capture that failed")

    spec, ids = SpecConfig(k=4, max_new_tokens=24, strategy="eagle"), own_pair.encode("ROMEO:\nWhat light")

    def run(fail: bool):
        decode_as(own_pair, "replayed")  # a fresh head slot: nothing captured, nothing failed
        if fail:
            monkeypatch.setattr(HeadSlot, "_capture_read", failing)
        else:
            own_pair.static_slots["head"].read_failed = True  # eager reads, no capture tried
        rounds = list(speculative_rounds(own_pair, ids, SamplingConfig(0.0), spec))
        monkeypatch.undo()
        return [[(t.token_id, t.label) for t in r.tokens] for r in rounds]

    failed, eager = run(True), run(False)
    assert own_pair.static_slots["head"].read_failed
    assert failed == eager
