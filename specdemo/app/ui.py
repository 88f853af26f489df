"""The Gradio Blocks: layout and event wiring only.

Owns where every component sits and which handler each event calls (handlers.py), with the queue's concurrency
settings. It computes nothing: HTML comes from render.py, figures from plots.py, runs from runs.py, the page's CSS
from style.py and its JavaScript from page_js.py. Handlers name the outputs they update; `named` maps those names to
the components registered here under the same names.

Adding a control: create it where it sits (`talk_controls`, `drafting`, `sampling`) as `c["name"]`; add its name to
GENERATE_INPUTS (or to the inputs of the events that read it) and a parameter of the same meaning to the handler,
after the existing ones, with a default; put its label (and info) under `ui.<name>` in both catalogues of i18n.py,
and its field name under `field.<name>` if validation.py checks it.
"""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace

import gradio as gr

from specdemo import i18n
from specdemo.config import DEFAULT_PRESET, NGRAM_RANGE, PRESETS, TREE_DEPTH_RANGE, TREE_TOPK_RANGE, env_int
from specdemo.limits import Limits
from specdemo.models import eagle3_files

from . import experiments, handlers, plots, recorded, render, stops, style, tree_view, views
from .page_js import (CLAMP_JS, CLICK_JS, DETECT_JS, DOWNLOAD_JS, FILM_CLICK_JS, KEYS_JS, LOCALE_JS, RESIZE_JS, SUBMIT_JS,
                      VIEW_JS)

GENERATE_INPUTS = ("pair", "draft", "target", "prompt", "k", "temperature", "top_k", "top_p", "max_new", "seed",
                   "baseline", "lenience", "chat", "strategy")  # then lang, presenter, ngram and TREE_INPUTS
TREE_INPUTS = ("tree_topk", "tree_depth", "tree_budget")  # generate_ui's last three parameters
NUMBER_INPUTS = ("k", "temperature", "top_k", "top_p", "max_new", "seed", "lenience", "ngram", *TREE_INPUTS)


def named(fn, names: tuple[str, ...]):
    """`fn` returns (or yields) {output name: value}; gradio takes one value per output, in order. A name left out
    is left as it is on the page (gr.skip())."""

    def order(out: dict):
        unknown = set(out) - set(names)
        assert not unknown, f"{fn.__name__} updates outputs it was not wired to: {sorted(unknown)}"
        values = [out.get(name, gr.skip()) for name in names]
        return values[0] if len(values) == 1 else values

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            for out in fn(*args, **kwargs):
                yield order(out)
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return order(fn(*args, **kwargs))
    return call


def ending(fn):
    """A model run's handler whose stream, when it ends by itself (not by gradio's cancel), marks its run's token
    ended (stops.ended; the token is the handler's last argument). It wraps the handler here, in the serving
    process, so that the mark holds on ZeroGPU too, where the handler works in a GPU worker."""

    @functools.wraps(fn)
    def stream(*args, **kwargs):
        yield from fn(*args, **kwargs)
        stops.ended(args[-1] if args else "")
    return stream


def checked_later(field: gr.Slider | gr.Number) -> gr.Slider | gr.Number:
    """A model run's slider or number field whose value, when it is no number within the field's range (an API
    caller's null, or 99 for K), reaches the handler as it came, for validation.py to refuse in the caller's
    language, naming the field. gradio's own check gave an English sentence that names no field, or for a null an
    empty error; a page's field never sends such a value. (An instance's method, not a subclass: gradio writes a .pyi
    file beside the module of every component subclass. A session whose field gradio rebuilds after an update, a
    pair change setting K, has gradio's own check again; only a page does that, and a page sends no such value.)"""
    own = field.preprocess

    def preprocess(payload):
        number = isinstance(payload, (int, float)) and not isinstance(payload, bool)
        lo, hi = field.minimum, field.maximum
        return own(payload) if number and (lo is None or payload >= lo) and (hi is None or payload <= hi) else payload

    field.preprocess = preprocess
    return field


def controls(u, limits: Limits, pair_name: str) -> None:
    """The left column (into `u`; `u.c` holds the inputs a run reads, by GENERATE_INPUTS name). On top what a talk
    uses: the prompt, Generate / Stop, the reply-or-story switch, the example prompts and the pair; below, folded,
    the settings a speaker rarely changes (who drafts, K, sampling, the token budget, the seed), whose values are
    the pair's page defaults."""
    L = i18n.label
    u.c = {}
    talk_controls(u, pair_name)
    with gr.Accordion(L("ui.settings"), open=False, elem_id="sd-settings"):
        u.c["chat"] = gr.Checkbox(PRESETS[pair_name].chat, label=L("ui.chat"), elem_id="sd-chat")
        drafting(u, limits, pair_name)
        sampling(u.c, limits, views.preset_defaults(pair_name, limits))
    with gr.Accordion(L("ui.lenience_box"), open=False):
        gr.Markdown(L("ui.lenience_note"))
        u.c["lenience"] = gr.Slider(0.05, 1, value=1, step=0.05, label=L("ui.lenience"))
    with gr.Accordion(L("app.how_box"), open=False, elem_id="sd-how"):
        gr.Markdown(L("app.how"))


def talk_controls(u, pair_name: str) -> None:
    """The prompt, Generate and Stop (Stop idle until a run starts), the reply-or-story switch, the example
    prompts, and the pair with its custom ids and its status."""
    preset, L, c = PRESETS[pair_name], i18n.label, u.c
    c["prompt"] = gr.Textbox(label=L("ui.prompt"), lines=3, value=preset.examples[0], elem_id="sd-prompt")
    with gr.Row(elem_id="sd-run-row"):
        u.go_btn = gr.Button(L("ui.generate"), variant="primary", elem_id="sd-generate")
        u.stop_btn = gr.Button(L("ui.stop"), variant="stop", elem_id="sd-stop", interactive=False)
    # the token views show the reply as text (kept tokens, coloured by how they came) or the full story
    u.view = gr.Radio([(L("ui.view_kept"), "kept"), (L("ui.view_story"), "story")], value="kept",
                      label=L("ui.view"), elem_id="sd-view")
    u.examples = gr.Dataset(components=[c["prompt"]], samples=[[e] for e in preset.examples],
                            label=L("ui.examples"))
    # the short name in the box, which fits it; the models it means on the line above (views.pair_line)
    c["pair"] = gr.Dropdown(
        choices=[(views.pair_choice(name), name) for name in PRESETS] + [(L("ui.pair_custom"), handlers.CUSTOM)],
        value=pair_name, label=L("ui.pair"), info=views.pair_line(pair_name), elem_id="sd-pair")
    with gr.Group(visible=False) as u.custom_box:
        c["draft"] = gr.Textbox(label=L("ui.draft_id"), placeholder=L("ui.draft_placeholder"),
                                elem_id="sd-draft-id")
        c["target"] = gr.Textbox(label=L("ui.target_id"), placeholder=L("ui.target_placeholder"),
                                 elem_id="sd-target-id")
        c["head"] = gr.Textbox(label=L("ui.head_id"), placeholder=L("ui.head_placeholder"), elem_id="sd-head-id")
        # the runs read the head from a State, which is no parameter of their public endpoints: API callers keep
        # their argument lists, and /generate takes a head by name
        u.head_state = gr.State("")
        u.load_btn = gr.Button(L("ui.load_pair"), size="sm", elem_id="sd-load")
    u.pair_status = gr.Markdown(elem_id="sd-pair-status")


def drafting(u, limits: Limits, pair_name: str) -> None:
    """K and who drafts, side by side in one box: the strategy, the lookup n-gram size (for prompt lookup) and the
    tree's sizes (for the EAGLE tree), each shown only with its strategy."""
    preset, L, c = PRESETS[pair_name], i18n.label, u.c
    with gr.Group(elem_id="sd-drafting"):
        c["k"] = gr.Slider(1, limits.max_k, value=views.preset_defaults(pair_name, limits)["k"], step=1,
                           label=L("ui.k"), elem_id="sd-k")
        c["strategy"] = gr.Radio(
            views.strategy_choices(pair_name), value=preset.strategy, label=L("ui.strategy"),
            info=L("ui.strategy_info"), elem_id="sd-strategy")
        c["ngram"] = gr.Slider(*NGRAM_RANGE, value=3, step=1, label=L("ui.ngram"), info=L("ui.ngram_info"),
                               visible=preset.strategy == "lookup", elem_id="sd-ngram")
        with gr.Column(visible=preset.strategy == "tree", elem_id="sd-tree-sizes") as u.tree_box:
            # 0 takes the head's own size (drafters.run_tree_shape); the budget stops at the server's limit
            c["tree_topk"] = gr.Slider(0, TREE_TOPK_RANGE[1], value=0, step=1, label=L("ui.tree_topk"),
                                       elem_id="sd-tree-topk")
            c["tree_depth"] = gr.Slider(0, TREE_DEPTH_RANGE[1], value=0, step=1, label=L("ui.tree_depth"),
                                        elem_id="sd-tree-depth")
            c["tree_budget"] = gr.Slider(0, limits.max_tree, value=0, step=1, label=L("ui.tree_budget"),
                                         elem_id="sd-tree-budget")


def sampling(c: dict, limits: Limits, first: dict) -> None:
    """The temperature, top-k and top-p, the token budget, the seed and the baseline switch (`first`: the pair's
    page defaults)."""
    L = i18n.label
    c["temperature"] = gr.Slider(0, 2, value=first["temperature"], step=0.05, label=L("ui.temperature"),
                                 elem_id="sd-temperature")
    with gr.Row():
        c["top_k"] = gr.Number(0, label=L("ui.top_k"), precision=0, minimum=0)
        # a slider under 240 px squeezes its label beside its number box: below that the row wraps instead
        c["top_p"] = gr.Slider(0.01, 1, value=1, step=0.01, label=L("ui.top_p"), min_width=240)
    with gr.Row():
        c["max_new"] = gr.Slider(1, limits.max_new_tokens, value=first["max_new"], step=1, label=L("ui.max_new"),
                                 elem_id="sd-max-new")
        c["seed"] = gr.Number(0, label=L("ui.seed"), precision=0, minimum=0, elem_id="sd-seed")
    c["baseline"] = gr.Checkbox(True, label=L("ui.baseline"))


def results(u, limits: Limits, first: dict, n_rounds: int) -> None:
    """The right column (into `u`): the legend, the stats, the token view, the keys' hint, two charts and the
    tabs. `first` holds what they show before any click (views.opening: the recorded run, or nothing), and
    n_rounds its rounds."""
    L = i18n.label
    u.legend = gr.HTML(render.legend(), elem_id="sd-legend")
    u.stats = gr.HTML(first["stats"], elem_id="sd-stats")  # above the text, so a growing reply never moves it
    u.tokens = gr.HTML(first["tokens"], elem_id="sd-token-view", js_on_load=CLICK_JS, max_height=400,
                       autoscroll=True)
    u.keys = gr.HTML(render.keys_hint(), elem_id="sd-keys", js_on_load=KEYS_JS + CLAMP_JS + RESIZE_JS)
    with gr.Row(elem_id="sd-charts-row"):
        u.race = gr.Plot(first["race"], elem_id="sd-race", show_label=False)
        u.acc_round = gr.Plot(first["acc_round"], elem_id="sd-acc-round", show_label=False)
    with gr.Tabs(elem_id="sd-tabs") as u.tabs:
        with gr.Tab(L("tab.film"), id="film") as u.tab_film:
            film_tab(u, limits, first, n_rounds)
        with gr.Tab(L("tab.charts"), id="charts") as u.tab_charts:
            u.times = gr.Plot(first["times"], elem_id="sd-times", show_label=False)
            with gr.Row():
                u.hist = gr.Plot(first["hist"], show_label=False)
                u.by_pos = gr.Plot(first["by_pos"], show_label=False)
            u.theory = gr.Plot(first["theory"], show_label=False)
        experiment_tabs(u, limits)
        with gr.Tab(L("tab.step"), id=handlers.STEP_TAB) as u.tab_step:
            with gr.Row():
                u.reset_btn = gr.Button(L("ui.step_first"), elem_id="sd-first-round")
                u.prev_btn = gr.Button(L("ui.step_prev"), elem_id="sd-prev-round")
                u.next_btn = gr.Button(L("ui.step_next"), variant="primary", elem_id="sd-next-round")
            u.step_caption = gr.Markdown(first["step_caption"], elem_id="sd-step-caption")
            u.step_tokens = gr.HTML(first["step_tokens"], elem_id="sd-step-tokens")
        with gr.Tab(L("tab.export"), id="export") as u.tab_export:
            u.download_btn = gr.Button(L("ui.download"), size="sm", elem_id="sd-download")
            gr.Markdown(L("ui.export_note"), elem_id="sd-export-note")
            # carries a finished run's trace (also the last output of /generate_stream) to DOWNLOAD_JS, undrawn: as a
            # visible JSON tree (17,000 elements for 128 tokens) it froze the page for 11 s when the tab first opened
            u.trace_json = gr.JSON(visible=False)


def film_tab(u, limits: Limits, first: dict, n_rounds: int) -> None:
    """The film strip, the round and position sliders, and the round inspector (its chart, then its reason with
    the round's tree below), opened on first["round_sl"]."""
    L = i18n.label
    u.film = gr.HTML(first["film"], elem_id="sd-film", js_on_load=FILM_CLICK_JS)
    with gr.Row(elem_id="sd-round-row"):
        u.round_sl = gr.Slider(1, max(2, n_rounds), value=first["round_sl"], step=1, label=L("ui.round"),
                               interactive=n_rounds > 1)
        # a chain keeps at most K + 1 tokens a round, a tree at most its depth + 1
        pos = first["pos_sl"]  # views.opened_round: the position and the round's length
        u.pos_sl = gr.Slider(1, pos["maximum"], value=pos["value"], step=1, label=L("ui.position"))
    u.insp_plot = gr.Plot(first["insp_plot"], elem_id="sd-inspector", show_label=False)
    u.insp_reason = gr.HTML(first["insp_reason"], elem_id="sd-reason")


def experiment_tabs(u, limits: Limits) -> None:
    """The K sweep, the strategy race and the distribution check: each its own button, chart and table."""
    L = i18n.label
    with gr.Tab(L("tab.sweep"), id="sweep") as u.tab_sweep:
        gr.Markdown(L("sweep.intro"))
        with gr.Row():
            u.k_from = gr.Slider(1, limits.max_k, value=1, step=1, label=L("ui.k_from"))
            u.k_to = gr.Slider(1, limits.max_k, value=min(8, limits.max_k), step=1, label=L("ui.k_to"))
        u.sweep_btn = gr.Button(L("ui.sweep_run"), elem_id="sd-sweep-run")
        u.sweep_plot = gr.Plot(plots.k_sweep([], None, None), show_label=False)
        u.sweep_md = gr.Markdown()
    with gr.Tab(L("tab.race"), id="race") as u.tab_race:
        gr.Markdown(L("race.intro"))
        u.race_btn = gr.Button(L("race.run"), elem_id="sd-race-run")
        u.race_plot = gr.Plot(plots.strategy_race({}), show_label=False, elem_id="sd-race-plot")
        u.race_md = gr.Markdown(elem_id="sd-race-table")
    with gr.Tab(L("tab.dist"), id="dist") as u.tab_dist:
        u.n_samples = gr.Slider(100, limits.max_samples, value=min(2000, limits.max_samples), step=100,
                                label=L("ui.samples"))
        u.dist_btn = gr.Button(L("ui.draw"), elem_id="sd-dist-run")
        u.dist_plot = gr.Plot(show_label=False)
        u.dist_md = gr.Markdown()


def wire_events(demo: gr.Blocks, u) -> None:
    """Which handler each event calls, with which inputs and outputs, in which queue group."""
    # the outputs, by the names handlers.py uses
    o = vars(u) | {name: u.c[name] for name in ("chat", "k", "temperature", "max_new", "pair", "draft", "target",
                                                "head", "strategy")}

    def wire(fn, names):
        """The handler, adapted to its outputs by name, and the components of those names."""
        return dict(fn=named(fn, names), outputs=[o[name] for name in names])

    view = [u.lang, u.presenter]  # every UI handler's view inputs
    wire_runs(u, wire, view)
    wire_browsing(u, wire, view)
    wire_page(demo, u, wire, view)
    gr.api(handlers.generate_api, api_name="generate", concurrency_id="models")


def wire_runs(u, wire, view: list) -> None:
    """The model runs (Generate, the K sweep, the distribution check, the race), Stop, and the trace download."""
    c = u.c
    buttons = dict(queue=False, api_visibility="private", show_progress="hidden")
    for field in [c[name] for name in NUMBER_INPUTS] + [u.k_from, u.k_to, u.n_samples]:
        checked_later(field)

    def model_run(trigger, fn, outputs, marked=(), **kwargs):
        """A model run that `trigger` (a click) starts: the buttons say that a run is going, the run, and then they
        say that none is, however it ended (handlers.run_over). After a refusal, the outputs `marked` (those whose
        gradio tracker shows) are named again, unchanged, which takes gradio's red "Error" pill off them: the
        refusal's toast says what was wrong, and the page stays as it was."""
        started = trigger(**wire(handlers.run_started, handlers.STARTED_OUTPUTS), **buttons)
        kwargs["inputs"] = kwargs["inputs"] + [u.run_token]  # the run's token (stops.py), after every other input
        run = started.then(**wire(ending(fn), outputs), concurrency_id="models", **kwargs)
        over = dict(inputs=[u.state, u.lang, u.run_mark], **buttons)
        run.then(**wire(handlers.run_done, handlers.OVER_OUTPUTS), **over)
        run.failure(**wire(handlers.run_over, handlers.OVER_OUTPUTS), **over)
        if marked:
            run.failure(**wire(lambda: {name: gr.update() for name in marked}, marked), **buttons)
        return run

    inputs = ([c[name] for name in GENERATE_INPUTS] + view + [c["ngram"]] + [c[name] for name in TREE_INPUTS]
              + [u.head_state])  # the custom pair's EAGLE-3 head, last
    # no gradio tracker: the stats draw the run's status and the baseline's bar themselves (render.stats_html), in a
    # line of fixed height, so that nothing above the reply moves or blinks while the run streams. The run's status
    # still lives on the stats alone: an error (or a cancel that crosses an update) marks them, and run_over, which
    # redraws them, clears it; on the inspector's outputs it would stay ("Error" above the round's reason)
    gen = model_run(u.go_btn.click, handlers.generate_ui, handlers.RUN_OUTPUTS, inputs=inputs,
                    api_name="generate_stream", api_visibility="undocumented", show_progress="hidden",
                    show_progress_on=[u.stats])
    gen.success(**wire(handlers.select_round, handlers.INSPECT_OUTPUTS), inputs=[u.state, u.round_sl] + view,
                api_visibility="private", show_progress="hidden")
    u.busy = gr.Checkbox(visible=False)  # carries SUBMIT_JS's finding (Generate disabled: a run is going)
    c["prompt"].submit(handlers.refuse_busy, [u.busy, u.lang], None, js=SUBMIT_JS, api_visibility="private",
                       concurrency_id="notices", concurrency_limit=None, show_progress="hidden")
    c["strategy"].change(lambda s: (gr.update(visible=s == "lookup"), gr.update(visible=s == "tree")), c["strategy"],
                         [c["ngram"], u.tree_box], api_visibility="private", queue=False, show_progress="hidden")

    common = [c["pair"], c["draft"], c["target"], c["prompt"]]
    sweep = model_run(u.sweep_btn.click, experiments.k_sweep_ui, experiments.SWEEP_OUTPUTS,
                      experiments.shown(experiments.SWEEP_OUTPUTS), api_name="k_sweep",
                      inputs=common + [c["temperature"], c["top_k"], c["top_p"], c["max_new"], c["seed"], u.k_from,
                                       u.k_to, c["chat"]] + view + [u.head_state])
    dist = model_run(u.dist_btn.click, experiments.distribution_ui, experiments.DIST_OUTPUTS,
                     experiments.shown(experiments.DIST_OUTPUTS), api_name="distribution_check",
                     inputs=common + [c["temperature"], c["top_k"], c["top_p"], c["lenience"], u.n_samples, c["seed"],
                                      c["chat"]] + view + [c["strategy"], c["k"], c["ngram"]]
                     + [c[n] for n in TREE_INPUTS] + [u.head_state])
    race = model_run(u.race_btn.click, experiments.strategy_race_ui, experiments.RACE_OUTPUTS,
                     experiments.shown(experiments.RACE_OUTPUTS), api_name="strategy_race",
                     inputs=common + [c["k"], c["temperature"], c["top_k"], c["top_p"], c["max_new"], c["seed"],
                                      c["chat"]] + view + [c["ngram"]] + [c[n] for n in TREE_INPUTS] + [u.head_state])
    u.stop_btn.click(**wire(handlers.stop_run, ("stop_btn",)), inputs=[u.run_mark], cancels=[gen, sweep, dist, race],
                     **buttons)
    u.download_btn.click(**wire(handlers.trace_of, ("trace_json",)), inputs=[u.state], api_visibility="private",
                         queue=False).then(None, [u.trace_json], None, js=DOWNLOAD_JS, api_visibility="private")


def wire_browsing(u, wire, view: list) -> None:
    """Moving through a finished run: the round and position sliders, the film strip, the step-through keys. None
    shows gradio's timer: a round opens in a fraction of a second, and a "0.4s" in 12 px over the inspector is noise
    on a projector."""
    quiet = dict(api_visibility="private", show_progress="hidden")
    u.round_sl.change(**wire(handlers.select_round, handlers.INSPECT_OUTPUTS), inputs=[u.state, u.round_sl] + view,
                      **quiet)
    u.pos_sl.release(**wire(handlers.inspect_round, handlers.INSPECT_OUTPUTS[1:]),
                     inputs=[u.state, u.round_sl, u.pos_sl] + view, **quiet)
    for clickable in (u.film, u.tokens):
        clickable.click(**wire(handlers.film_click, ("round_sl", "film")), inputs=[u.state, u.lang], **quiet)

    # no queue limit: one session's steps never wait for another's; within a session they take turns on the
    # session's own lock (handlers.step_round), so quick presses each read the cursor the previous one wrote. The
    # page sends a key's step only once the view of the one before it has landed (page_js.KEYS_JS)
    # (no tracker either: its timer inside the caption's block would read to KEYS_JS as the view landing)
    step = dict(concurrency_id="step", concurrency_limit=None, trigger_mode="multiple", show_progress="hidden")
    for btn, direction in ((u.reset_btn, 0), (u.prev_btn, -1), (u.next_btn, 1)):
        btn.click(**wire(handlers.step_button(direction), handlers.STEP_OUTPUTS), inputs=[u.state, u.lang],
                  api_name=handlers.STEP_NAMES[direction], api_visibility="undocumented", **step)
    u.keys.click(**wire(handlers.step_key, handlers.STEP_OUTPUTS + ("tabs",)), inputs=[u.state, u.lang],
                 api_visibility="private", **step)


def wire_page(demo: gr.Blocks, u, wire, view: list) -> None:
    """The pair (its status, its strategies), the example prompts, the language and presenter mode."""
    c = u.c
    # a pair change loads models, but never waits behind (or holds up) the model runs: its own queue group
    pair_change = dict(**wire(handlers.change_pair, handlers.PAIR_OUTPUTS),
                       inputs=[c["pair"], c["draft"], c["target"], u.lang, u.pair_state, c["head"]],
                       api_visibility="private",
                       concurrency_id="pairs", concurrency_limit=env_int("SPECDEMO_CONCURRENCY", 4))
    c["head"].change(lambda head: head, c["head"], u.head_state, api_visibility="private", queue=False)
    c["pair"].change(**pair_change)
    held = gr.State("")  # the strategy a pair without a head set aside (handlers.update_strategies)
    strategies = dict(fn=handlers.update_strategies, inputs=[c["pair"], c["strategy"], held, u.pair_state],
                      outputs=[c["strategy"], held], api_visibility="private", queue=False)
    c["pair"].change(**strategies)
    u.pair_state.change(**strategies)  # a custom pair that loaded with a head offers eagle and tree
    c["strategy"].input(lambda: "", None, held, api_visibility="private", queue=False)  # the visitor's own pick
    u.load_btn.click(**pair_change)
    u.examples.click(lambda sample: sample[0] if isinstance(sample, (list, tuple)) else sample, u.examples,
                     c["prompt"], api_visibility="private")

    # language and presenter mode: the browser's language first, then the switch; both redraw in place
    u.browser_lang = gr.Textbox(visible=False)  # carries navigator.language from DETECT_JS to initial_lang
    # the page's own pair, once it is open: it keeps any setting the visitor changed while it loads (open_pair)
    demo.load(handlers.initial_lang, [u.browser_lang], [u.lang], js=DETECT_JS, api_visibility="private").then(
        **(pair_change | wire(handlers.open_pair, handlers.PAIR_OUTPUTS)))
    redraw_inputs = view + [u.state, u.round_sl, u.pos_sl, u.sweep_state, u.dist_state, u.race_state, u.pair_state]
    u.lang.change(None, [u.lang], None, js=LOCALE_JS)
    u.lang.change(handlers.notice_in, [u.notice_state, u.lang], [u.notice], api_visibility="private", queue=False,
                  show_progress="hidden")
    u.view.change(None, [u.view], None, js=VIEW_JS)
    # the switches' redraws only render (no model), so they answer in their own HTTP reply (queue=False), as the
    # buttons' updates do: a queued one waited on the session's event stream, and under load one stayed "pending"
    # for 90 s on a page whose language had switched (decisions.md, 2026-11-28)
    redrawn = dict(api_visibility="private", show_progress="hidden", queue=False)
    u.presenter.change(handlers.presenter_layout, [u.presenter], [u.app_col], **redrawn)
    for switch in (u.lang, u.presenter):
        switch.change(**wire(handlers.redraw, handlers.REDRAW_OUTPUTS), inputs=redraw_inputs, **redrawn)
    # gradio re-translates only the open tab's label on a locale change, so the server sends all of them
    u.lang.change(**wire(views.tab_labels, handlers.TAB_OUTPUTS), inputs=[u.lang], **redrawn)


def build_demo(pair_name: str = DEFAULT_PRESET, missing: tuple[str, Exception] | None = None) -> gr.Blocks:
    """The page, opened on `pair_name` and its recorded run (recorded.py) where it has one. missing: (the default
    pair, why it could not be loaded) when app.py opened another pair instead; the page says so in one sentence."""
    eagle3_files.SERVED = True  # a visitor's head id names no folder here unless the operator allows it
    limits = Limits.from_env()
    L = i18n.label
    u = SimpleNamespace()  # every component, by the name the handlers use for it
    opened = recorded.load(pair_name)
    state = {"spec": opened[0], "base": opened[1], "cursor": 0} if opened else None
    notices = {code: views.missing_notice(*missing, code) for _, code in i18n.CHOICES} if missing else None
    with gr.Blocks(title=i18n.EN["app.title"], delete_cache=(3600, 3600)) as demo:
        u.state = gr.State(state)
        # the page's latest model run (handlers.run_started; stops.py): the run reads it from the session's state (no
        # parameter of the public endpoints), Stop and run_over from the page, as it was when they were fired (a
        # State is read when the handler runs, and a run_over fired by a stopped run may run after the next started)
        u.run_token = gr.State("")
        u.run_mark = gr.Textbox(visible=False)
        u.sweep_state, u.dist_state, u.race_state, u.pair_state = (gr.State(None) for _ in range(4))
        u.notice_state = gr.State(notices)
        with gr.Column(elem_id="sd-app") as u.app_col:  # presenter mode sets a class here (style.CSS)
            with gr.Row(equal_height=False, elem_id="sd-header"):
                with gr.Column(scale=3):
                    gr.Markdown(L("app.intro"), elem_id="sd-intro")
                    u.notice = gr.Markdown(notices[i18n.DEFAULT] if notices else "", visible=bool(notices),
                                           elem_id="sd-notice")
                with gr.Column(scale=1, min_width=400, elem_id="sd-switches"):
                    u.lang = gr.Radio(i18n.CHOICES, value=i18n.DEFAULT, label=L("ui.language"), elem_id="sd-lang")
                    u.presenter = gr.Checkbox(False, label=L("ui.presenter"), elem_id="sd-presenter",
                                              container=False)
            with gr.Row(equal_height=False, elem_id="sd-main"):
                with gr.Column(scale=1, min_width=320, elem_id="sd-controls"):
                    controls(u, limits, pair_name)
                with gr.Column(scale=2, elem_id="sd-results"):
                    results(u, limits, views.opening(state), len(views.rounds_of(state)))
        wire_events(demo, u)
    demo.queue(default_concurrency_limit=env_int("SPECDEMO_CONCURRENCY", 4),
               max_size=env_int("SPECDEMO_QUEUE_SIZE", 64))
    return demo


def launch(demo: gr.Blocks, **kwargs):
    """Launch with specdemo's CSS, theme and message catalogue (gradio 6 takes all three at launch). Host and port
    follow gradio's own settings (GRADIO_SERVER_NAME, GRADIO_SERVER_PORT) unless given here."""
    kwargs.setdefault("show_error", False)
    # the page has no file input, but gradio's upload route takes any file and serves it back for hours
    kwargs.setdefault("max_file_size", "1kb")
    # system fonts only: the page makes no request outside the server (works offline, no third-party font host)
    theme = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"])
    return demo.launch(css=style.CSS + tree_view.TREE_CSS, theme=theme, i18n=i18n.gradio_i18n(), **kwargs)
