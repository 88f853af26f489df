"""The caps of a deployment, read from the environment: the longest reply, prompt and draft, the largest draft
tree, the time a request may take, and which custom models a visitor may load. Unset, the model and tree caps follow
the device (models.devices), so a CPU Space and an 80 GB GPU get defaults that fit them. The engine reads max_k and
max_tree; the app checks every request against the rest (app/validation.py)."""

from __future__ import annotations

from dataclasses import dataclass

from specdemo.config import env_int
from specdemo.models import devices


@dataclass(frozen=True)
class Limits:
    """Caps for a public deployment, read from the environment (defaults suit a CPU Space)."""

    max_new_tokens: int = 256  # SPECDEMO_MAX_NEW_TOKENS
    max_prompt_chars: int = 4000  # SPECDEMO_MAX_PROMPT_CHARS
    max_k: int = 12  # SPECDEMO_MAX_K
    max_tree: int = 0  # SPECDEMO_MAX_TREE: the most nodes a draft tree may have (0: devices.default_max_tree)
    max_samples: int = 5000  # SPECDEMO_MAX_SAMPLES (distribution check)
    time_limit_s: int = 120  # SPECDEMO_TIME_LIMIT_S (per request; ZEROGPU_TIME_LIMIT_S on a ZeroGPU Space)
    allow_custom: bool = True  # SPECDEMO_ALLOW_CUSTOM (custom hub ids)
    allow_local: bool = False  # SPECDEMO_ALLOW_LOCAL (custom ids may also be folders on the server's disk)
    max_params_m: int = 500  # SPECDEMO_MAX_PARAMS_M (millions of parameters per custom model)
    MIN_CUSTOM_M = 124  # below a cap of gpt2's size, custom ids are off unless SPECDEMO_ALLOW_CUSTOM=1
    ZEROGPU_TIME_LIMIT_S = 60  # unset on ZeroGPU: each request asks for it (+ zerogpu.GPU_MARGIN_S) of a visitor's
    #                            daily GPU quota before it runs, so 150 s a click would refuse visitors with little left

    @classmethod
    def from_env(cls) -> Limits:
        """The limits from the environment. Unset, the custom-model cap follows the device's memory
        (devices.default_max_params_m), and custom ids are on only where that cap fits at least gpt2; a cap the
        operator sets leaves them on unless SPECDEMO_ALLOW_CUSTOM=0."""
        set_cap = env_int("SPECDEMO_MAX_PARAMS_M", 0)
        cap = set_cap or devices.default_max_params_m()
        custom_default = 1 if set_cap else int(cap >= cls.MIN_CUSTOM_M)  # an operator's cap is their choice
        return cls(
            max_new_tokens=env_int("SPECDEMO_MAX_NEW_TOKENS", cls.max_new_tokens),
            max_prompt_chars=env_int("SPECDEMO_MAX_PROMPT_CHARS", cls.max_prompt_chars),
            max_k=env_int("SPECDEMO_MAX_K", cls.max_k),
            max_tree=min(env_int("SPECDEMO_MAX_TREE", 0) or devices.default_max_tree(), devices.MAX_TREE_NODES),
            max_samples=env_int("SPECDEMO_MAX_SAMPLES", cls.max_samples),
            time_limit_s=env_int("SPECDEMO_TIME_LIMIT_S",
                                 cls.ZEROGPU_TIME_LIMIT_S if devices.zerogpu_space() else cls.time_limit_s),
            allow_custom=env_int("SPECDEMO_ALLOW_CUSTOM", custom_default) != 0,
            allow_local=env_int("SPECDEMO_ALLOW_LOCAL", 0) != 0,
            max_params_m=cap,
        )
