"""specdemo's entry point: `python app.py` serves the demo; Hugging Face Spaces runs this file too.

`demo` is importable at module level (the Spaces convention). Host and port follow gradio's settings
(GRADIO_SERVER_NAME, GRADIO_SERVER_PORT); the limits and switches are listed in the README.
"""

from specdemo.config import DEFAULT_PRESET
from specdemo.models import load_pair
from specdemo.ui import build_demo, launch

load_pair(DEFAULT_PRESET)  # the embedded pair is loaded before the first visitor arrives
demo = build_demo()

if __name__ == "__main__":
    launch(demo)
