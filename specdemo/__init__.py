"""specdemo: speculative sampling, exact and observable, with a Gradio demo.

    from specdemo import load_pair, speculative_generate, baseline_generate, SamplingConfig, SpecConfig
    pair = load_pair("shakespeare")
    trace = speculative_generate(pair, "ROMEO:\n", SamplingConfig(temperature=0.8), SpecConfig(k=4, seed=0))
    print(trace.text, trace.metrics())
"""

from .autoregressive import baseline_generate, baseline_steps
from .config import PRESETS, SamplingConfig, SpecConfig
from .events import Round, Step, Token, Trace
from .models import ModelLoadError, ModelPair, load_pair
from .speculative import PromptError, speculative_generate, speculative_rounds

__all__ = [
    "PRESETS",
    "ModelLoadError",
    "ModelPair",
    "PromptError",
    "Round",
    "SamplingConfig",
    "SpecConfig",
    "Step",
    "Token",
    "Trace",
    "baseline_generate",
    "baseline_steps",
    "load_pair",
    "speculative_generate",
    "speculative_rounds",
]
