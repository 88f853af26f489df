"""The Gradio Blocks: layout and event wiring only.

Owns where every component sits and which handler each event calls (handlers.py), with the queue's concurrency
settings. It computes nothing: HTML comes from render.py, figures from plots.py, runs from the engine.
"""

from __future__ import annotations

import gradio as gr

from . import handlers, plots, render
from .config import DEFAULT_PRESET, PRESETS, Limits, env_int

INTRO = """
# specdemo: speculative sampling, round by round
A small **draft** model guesses K tokens; the large **target** scores all of them in **one** forward pass and keeps
each guess with probability min(1, p/q). At the first rejection it draws a replacement from the residual
max(0, p − q), so the text follows **exactly** the target's distribution, only with fewer target calls
([Chen et al. 2023](https://arxiv.org/abs/2302.01318), [Leviathan et al. 2023](https://arxiv.org/abs/2211.17192)).
Hover a token for p, q, r and min(1, p/q); click a round to see why it was kept or resampled.
"""

LENIENCE_NOTE = """**Lossy.** Lenience b draws r from U[0, b) instead of U[0, 1): more drafts pass, so decoding gets
faster, but the output no longer follows the target's distribution. b = 1 is the exact algorithm. Watch the drift in
the Distribution check tab."""

# Delegated click: any element with data-round inside the component selects that round (film strip rows, tokens).
CLICK_JS = """
const pick = (e) => {
  const el = e.target.closest('[data-round]');
  if (el) trigger('click', {round: Number(el.dataset.round)});
};
element.addEventListener('click', pick);
element.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') pick(e); });
"""

# The trace downloads from the JSON already on the page, built in the browser: a server-side file would put the
# server's cache path into the page and into the API's answer (see handlers.generate_ui).
DOWNLOAD_JS = """
(trace) => {
  if (!trace || !trace.speculative) return;
  const url = URL.createObjectURL(new Blob([JSON.stringify(trace, null, 1)], {type: 'application/json'}));
  const a = document.createElement('a');
  a.href = url;
  a.download = 'specdemo-trace.json';
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
"""

GENERATE_INPUTS = ("pair", "draft", "target", "prompt", "k", "temperature", "top_k", "top_p", "max_new", "seed",
                   "baseline", "lenience", "chat", "strategy")


def build_demo() -> gr.Blocks:
    limits = Limits.from_env()
    preset = PRESETS[DEFAULT_PRESET]
    with gr.Blocks(title="specdemo: speculative sampling, round by round", delete_cache=(3600, 3600)) as demo:
        state = gr.State(None)
        gr.Markdown(INTRO)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=320):
                c = {}
                c["pair"] = gr.Dropdown(
                    choices=[(f"{name}: {p.draft.split('/')[-1]} \u2192 {p.target.split('/')[-1]}", name)
                             for name, p in PRESETS.items()] + [("custom: any two hub ids", handlers.CUSTOM)],
                    value=DEFAULT_PRESET, label="Model pair (draft \u2192 target)", elem_id="sd-pair")
                with gr.Group(visible=False) as custom_box:
                    c["draft"] = gr.Textbox(label="Draft model id", placeholder="e.g. openai-community/gpt2",
                                            elem_id="sd-draft-id")
                    c["target"] = gr.Textbox(label="Target model id", placeholder="e.g. openai-community/gpt2-xl",
                                             elem_id="sd-target-id")
                    load_btn = gr.Button("Load pair", size="sm", elem_id="sd-load")
                pair_status = gr.Markdown(elem_id="sd-pair-status")
                c["prompt"] = gr.Textbox(label="Prompt", lines=4, value=preset.examples[0], elem_id="sd-prompt")
                c["chat"] = gr.Checkbox(preset.chat, label="Chat: the prompt is a message and the models write the "
                                        "assistant's reply (off: continue the text as it is)", elem_id="sd-chat")
                examples = gr.Dataset(components=[c["prompt"]], samples=[[e] for e in preset.examples],
                                      label="Example prompts")
                with gr.Row():
                    c["k"] = gr.Slider(1, limits.max_k, value=4, step=1, label="K: draft tokens per round",
                                       scale=2)
                    c["strategy"] = gr.Radio(
                        [("fixed K", "fixed"), ("adaptive", "adaptive"), ("prompt lookup", "lookup")], value="fixed",
                        label="Drafting strategy", elem_id="sd-strategy", scale=3,
                        info="adaptive: the draft stops when unsure (up to 12). lookup: copy from the text, no draft")
                c["temperature"] = gr.Slider(0, 2, value=0.8, step=0.05, label="Temperature (0 = greedy)")
                with gr.Row():
                    c["top_k"] = gr.Number(0, label="Top-k (0 = off)", precision=0, minimum=0)
                    c["top_p"] = gr.Slider(0.01, 1, value=1, step=0.01, label="Top-p (1 = off)")
                with gr.Row():
                    c["max_new"] = gr.Slider(1, limits.max_new_tokens, value=min(128, limits.max_new_tokens), step=1,
                                             label="Max new tokens")
                    c["seed"] = gr.Number(0, label="Seed", precision=0, minimum=0)
                c["baseline"] = gr.Checkbox(True, label="Also run the target-only baseline (measures the speedup)")
                with gr.Accordion("Advanced: lenience (lossy)", open=False):
                    gr.Markdown(LENIENCE_NOTE)
                    c["lenience"] = gr.Slider(0.05, 1, value=1, step=0.05, label="Lenience b (1 = exact)")
                with gr.Row():
                    go_btn = gr.Button("Generate", variant="primary", elem_id="sd-generate")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="sd-stop")
            with gr.Column(scale=2):
                gr.HTML(render.legend(), elem_id="sd-legend")
                tokens = gr.HTML(render.tokens_html("", []), elem_id="sd-token-view", js_on_load=CLICK_JS,
                                 max_height=420, autoscroll=True)
                stats = gr.HTML(render.stats_html(None), elem_id="sd-stats")
                with gr.Row():
                    race = gr.Plot(plots.race(None, None), elem_id="sd-race", show_label=False)
                    acc_round = gr.Plot(plots.acceptance_per_round(None), elem_id="sd-acc-round", show_label=False)
                with gr.Tabs():
                    with gr.Tab("Film strip & inspector"):
                        film = gr.HTML(render.filmstrip_html([]), elem_id="sd-film", js_on_load=CLICK_JS)
                        with gr.Row():
                            round_sl = gr.Slider(1, 2, value=1, step=1, label="Round", interactive=False)
                            pos_sl = gr.Slider(1, limits.max_k + 1, value=1, step=1,
                                               label="Position in the round (K+1 = bonus)")
                        insp_plot = gr.Plot(plots.inspector_empty(), elem_id="sd-inspector", show_label=False)
                        insp_reason = gr.HTML(elem_id="sd-reason")
                    with gr.Tab("More charts"):
                        with gr.Row():
                            hist = gr.Plot(plots.accepted_length_histogram(None), show_label=False)
                            by_pos = gr.Plot(plots.acceptance_by_position(None), show_label=False)
                        theory = gr.Plot(plots.speedup_vs_theory(None, None), show_label=False)
                    with gr.Tab("K sweep"):
                        with gr.Row():
                            k_from = gr.Slider(1, limits.max_k, value=1, step=1, label="First K")
                            k_to = gr.Slider(1, limits.max_k, value=min(8, limits.max_k), step=1, label="Last K")
                        sweep_btn = gr.Button("Run K sweep (same prompt and seed)")
                        sweep_plot = gr.Plot(plots.k_sweep([], None, None), show_label=False)
                        sweep_md = gr.Markdown()
                    with gr.Tab("Strategy race"):
                        gr.Markdown("Target-only decoding, then every drafting strategy, on the same prompt and "
                                    "seed, one after another so that each is timed alone. At temperature 0 every "
                                    "text must equal the target's.")
                        race_btn = gr.Button("Run the race", elem_id="sd-race-run")
                        race_plot = gr.Plot(plots.strategy_race({}), show_label=False, elem_id="sd-race-plot")
                        race_md = gr.Markdown(elem_id="sd-race-table")
                    with gr.Tab("Distribution check"):
                        n_samples = gr.Slider(100, limits.max_samples, value=min(2000, limits.max_samples), step=100,
                                              label="Speculative samples of the first token")
                        dist_btn = gr.Button("Draw samples")
                        dist_plot = gr.Plot(show_label=False)
                        dist_md = gr.Markdown()
                    with gr.Tab("Step through"):
                        with gr.Row():
                            reset_btn = gr.Button("\u23ee Start")
                            prev_btn = gr.Button("\u25c0 Previous round")
                            next_btn = gr.Button("Next round \u25b6", variant="primary", elem_id="sd-next-round")
                        step_caption = gr.Markdown("Generate first; then step through the rounds one at a time.",
                                                   elem_id="sd-step-caption")
                        step_tokens = gr.HTML(elem_id="sd-step-tokens")
                    with gr.Tab("Export"):
                        download_btn = gr.Button("Download the trace (JSON)", size="sm", elem_id="sd-download")
                        trace_json = gr.JSON(label="Trace", open=False)

        inputs = [c[name] for name in GENERATE_INPUTS]
        outputs = [tokens, stats, film, race, acc_round, hist, by_pos, theory, trace_json, state, round_sl]
        run_args = dict(fn=handlers.generate_ui, inputs=inputs, outputs=outputs, concurrency_id="models",
                        api_visibility="undocumented", show_progress="minimal")
        gen_click = go_btn.click(api_name="generate_stream", **run_args)
        gen_submit = c["prompt"].submit(api_name=False, **run_args)
        for event in (gen_click, gen_submit):
            event.success(handlers.select_round, [state, round_sl], [pos_sl, insp_plot, insp_reason],
                          api_visibility="private")

        common = [c["pair"], c["draft"], c["target"], c["prompt"]]
        sweep_event = sweep_btn.click(
            handlers.k_sweep_ui, common + [c["temperature"], c["top_k"], c["top_p"], c["max_new"], c["seed"], k_from,
                                           k_to, c["chat"]],
            [sweep_plot, sweep_md], api_name="k_sweep", concurrency_id="models")
        dist_event = dist_btn.click(
            handlers.distribution_ui, common + [c["temperature"], c["top_k"], c["top_p"], c["lenience"], n_samples,
                                                c["seed"], c["chat"]],
            [dist_plot, dist_md], api_name="distribution_check", concurrency_id="models")
        race_event = race_btn.click(
            handlers.strategy_race_ui, common + [c["k"], c["temperature"], c["top_k"], c["top_p"], c["max_new"],
                                                 c["seed"], c["chat"]],
            [race_plot, race_md], api_name="strategy_race", concurrency_id="models")
        stop_btn.click(None, None, None, cancels=[gen_click, gen_submit, sweep_event, dist_event, race_event])
        download_btn.click(None, [trace_json], None, js=DOWNLOAD_JS, api_visibility="private")

        round_sl.change(handlers.select_round, [state, round_sl], [pos_sl, insp_plot, insp_reason],
                        api_visibility="private")
        pos_sl.release(handlers.inspect_round, [state, round_sl, pos_sl], [insp_plot, insp_reason],
                       api_visibility="private")
        film.click(handlers.film_click, [state], [round_sl, film], api_visibility="private")
        tokens.click(handlers.film_click, [state], [round_sl, film], api_visibility="private")

        for btn, direction in ((reset_btn, 0), (prev_btn, -1), (next_btn, 1)):
            btn.click(lambda s, d=direction: handlers.step_round(s, d), [state], [state, step_tokens, step_caption],
                      api_visibility="private")

        pair_change = dict(fn=handlers.change_pair, inputs=[c["pair"], c["draft"], c["target"]],
                           outputs=[pair_status, custom_box, examples, c["chat"]], api_visibility="private",
                           concurrency_id="models")
        c["pair"].change(**pair_change)
        load_btn.click(**pair_change)
        demo.load(**pair_change)
        examples.click(lambda sample: sample[0] if isinstance(sample, (list, tuple)) else sample, examples,
                       c["prompt"], api_visibility="private")

        gr.api(handlers.generate_api, api_name="generate", concurrency_id="models")

    demo.queue(default_concurrency_limit=env_int("SPECDEMO_CONCURRENCY", 4),
               max_size=env_int("SPECDEMO_QUEUE_SIZE", 64))
    return demo


def launch(demo: gr.Blocks, **kwargs):
    """Launch with specdemo's CSS and theme (gradio 6 takes both at launch). Host and port follow gradio's own
    settings (GRADIO_SERVER_NAME, GRADIO_SERVER_PORT) unless given here."""
    kwargs.setdefault("show_error", False)
    # system fonts only: the page makes no request outside the server (works offline, no third-party font host)
    theme = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"])
    return demo.launch(css=render.CSS, theme=theme, **kwargs)
