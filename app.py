"""specdemo's entry point: `python app.py` serves the demo; Hugging Face Spaces runs this file too.

`demo` is importable at module level (the Spaces convention). Host and port follow gradio's settings
(GRADIO_SERVER_NAME, GRADIO_SERVER_PORT); the limits and switches are listed in the README.
"""

from specdemo import SamplingConfig, SpecConfig, speculative_generate
from specdemo.config import DEFAULT_PRESET, PRESETS
from specdemo.models import load_pair
from specdemo.ui import build_demo, launch
from specdemo.zerogpu import on_zerogpu

# Load the default pair and run it once, with the strategy the page opens on, before the first visitor arrives:
# torch sets up its kernels on first use, which would otherwise land on the first request. On a ZeroGPU Space the
# main process has no GPU to run on: the pair is loaded here (spaces moves it into each GPU worker) and the workers
# warm up on their first request. A damaged head does not stop the start: the page's runs with it get its refusal.
_preset = PRESETS[DEFAULT_PRESET]
_pair = load_pair(DEFAULT_PRESET)
if not on_zerogpu():
    _strategy = "fixed" if _preset.strategy == "eagle" and _pair.head is None else _preset.strategy
    speculative_generate(_pair, _preset.examples[0], SamplingConfig(0.8),
                         SpecConfig(k=4, max_new_tokens=16, strategy=_strategy))
demo = build_demo()

if __name__ == "__main__":
    launch(demo)
