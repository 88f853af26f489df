"""specdemo: speculative sampling, exact and observable, with a Gradio demo.

    from specdemo import load_pair, speculative_generate, baseline_generate, SamplingConfig, SpecConfig
    pair = load_pair("shakespeare")
    trace = speculative_generate(pair, "ROMEO:\n", SamplingConfig(temperature=0.8), SpecConfig(k=4, seed=0))
    print(trace.text, trace.metrics())
"""

from specdemo.engine.autoregressive import baseline_generate, baseline_steps
from specdemo.engine.events import Round, Step, Token, Trace
from specdemo.engine.speculative import PromptError, speculative_generate, speculative_rounds
from specdemo.models import ModelLoadError, ModelPair, load_pair

from .config import PRESETS, SamplingConfig, SpecConfig

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
