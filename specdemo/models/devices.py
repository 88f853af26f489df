"""Which device a pair runs on, and which dtype each of its two models runs in.

Owns the device choice (SPECDEMO_DEVICE, else cuda, then mps, then cpu), the dtype names the CLI and the environment
accept, the CPU's bf16 check, the rule that picks a model's dtype by its role in the pair (`pick_dtype`), whether
bf16 weights are packed once for AMX (`packs_bf16`, with the two oneDNN calls that pack and multiply), and the
memory budget that model pairs share (`model_budget_bytes`). It loads nothing: loading.py asks it before it loads.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

from .weights import ModelLoadError

DTypeArg = torch.dtype | str | None  # a dtype as callers may give it: a torch.dtype, a name, or None (automatic)


def pick_device(requested: str | torch.device | None = None) -> torch.device:
    """The device asked for (or SPECDEMO_DEVICE's), checked; else CUDA, MPS or the CPU, the first that is here."""
    requested = requested or os.environ.get("SPECDEMO_DEVICE") or None
    if requested:
        return check_device(str(requested))
    if torch.cuda.is_available():
        return torch.device("cuda")
    if mps_here():
        return torch.device("mps")
    return torch.device("cpu")


def mps_here() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def check_device(name: str) -> torch.device:
    """`name` as a device of this machine, or a ModelLoadError that says why not (a misspelt name, or a GPU that is
    not here), instead of torch's traceback at the first tensor."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ModelLoadError("err.device", device=repr(name[:40])) from None
    if device.type == "cuda":
        here = torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()
    elif device.type == "mps":
        here = mps_here()
    else:
        here = device.type == "cpu"
    if not here:
        raise ModelLoadError("err.device_missing", device=str(device))
    return device


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
SMALL_MODEL_PARAMS = 5_000_000  # below this a CPU model is overhead-bound, and bf16's conversions cost more than
#                                 the bytes it saves (the 1.3M Shakespeare draft: 0.6 ms fp32, 0.8 ms bf16)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def parse_dtype(value, what: str = "dtype") -> torch.dtype | None:
    """A dtype given as a torch.dtype or a name (float32/fp32, bfloat16/bf16, float16/fp16); None or "auto" -> None."""
    if value is None or isinstance(value, torch.dtype):
        return value
    name = str(value).strip().lower()
    if name in ("", "auto"):
        return None
    if name not in DTYPES:
        raise ModelLoadError(f"Unknown {what} {str(value)[:30]!r}; use auto, float32, bfloat16 or float16.")
    return DTYPES[name]


_CPU_FLAGS: set[str] | None = None


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (an empty set where there is none), read once."""
    global _CPU_FLAGS
    if _CPU_FLAGS is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
            line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
            _CPU_FLAGS = set(line.partition(":")[2].split())
        except OSError:
            _CPU_FLAGS = set()
    return _CPU_FLAGS


def cpu_has_bf16() -> bool:
    """bf16 arithmetic in hardware: AMX (amx_bf16) or AVX-512 BF16 (avx512_bf16), and a torch built with oneDNN."""
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"}) and torch.backends.mkldnn.is_available()


def cpu_bf16_kind() -> str:
    """Which bf16 matrix units the CPU has: "amx", "avx512_bf16" or "none". bf16 products are accumulated in a
    different order on each, so a seeded bf16 run can pick different tokens on machines of different kinds."""
    flags = cpu_flags()
    return "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "none"


def pick_dtype(device: torch.device, role: str = "target", n_params: int | None = None) -> torch.dtype:
    """The dtype a model runs in, by its role in the pair.

    GPU: bf16 where its units have it (Ampere and later), fp16 elsewhere: torch's bf16 emulation on older GPUs is
    slow, and its check allocates on the device (outside the device's lock). CPU with bf16 in hardware: the target
    runs in bf16, because its job is the (K+1)-token verify, where bf16 wins by halving the bytes read (Shakespeare
    target, 5-token verify: 15 ms fp32, 11 ms bf16; SmolLM2-135M: 80-88 ms against 42-46 ms); the draft runs in
    bf16 too unless it is small (under SMALL_MODEL_PARAMS), where a one-token step is overhead-bound and fp32 is
    faster. An EAGLE head ("head") runs in bf16 at any size: it drafts right after each verify, which has pushed its
    weights (and its LM-head rows) out of the caches, so halving the bytes it reads cold outweighs the conversions.
    Shakespeare head, in the loop at T = 0: 3.3-3.7 ms of drafting a round in bf16 against 4.5-4.7 ms in fp32,
    although fp32 wins a hot microbenchmark (0.31 against 0.47 ms a step). Any other CPU: fp32.
    The rule reads flags and sizes only, so the same machine always picks the same dtypes, and so the same
    distribution for a seed.
    """
    if device.type == "cuda":
        return torch.bfloat16 if cuda_has_bf16() else torch.float16
    if device.type == "mps":
        return torch.float16
    if device.type == "cpu" and cpu_has_bf16():
        if role == "head":  # an EAGLE head, whatever its size: see the docstring
            return torch.bfloat16
        if role == "draft" and n_params is not None and n_params < SMALL_MODEL_PARAMS:
            return torch.float32
        return torch.bfloat16
    return torch.float32


def cuda_has_bf16() -> bool:
    """Whether the current CUDA device computes in bf16 itself (not by torch's emulation, which is slow, and whose
    test allocates on the device)."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # a torch from before the argument
        return torch.cuda.is_bf16_supported()


def packs_bf16(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a bf16 model's linear layers are packed once into oneDNN's blocked layout (models.pack_linears): on
    a CPU with bf16 units (AMX or AVX-512 BF16), where torch's plain bf16 `F.linear` lays the weight out again at
    every call. Measured on 2 threads with SmolLM2-135M, the outputs of each layer bit for bit those of F.linear
    at 1 to 32 rows on both kinds (tests/test_models.py checks it on each); at a prompt's 300 rows that holds on
    Zen 4, and is not claimed on AMX (issue 39), so every load packs alike (models.finish_model):
    - with AMX (Xeon, 2026-11-25): a one-token step 41.9 -> 34.4 ms, a 9-token verify 48.8 -> 43.4 ms;
    - with AVX-512 BF16 and no AMX (AMD EPYC, Zen 4, 2026-11-25, `scripts/experiments/pack_ab.py`): a one-token step
      34.9 -> 29.9 ms, a 12-token verify 45.6 -> 37.1 ms.
    Packing float32 weights was slower at one row, so float32 keeps F.linear. SPECDEMO_PACK=0 turns it off."""
    return (device.type == "cpu" and dtype == torch.bfloat16 and cpu_bf16_kind() != "none"
            and os.environ.get("SPECDEMO_PACK", "1").strip() != "0"
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 weight [out, in] laid out once for oneDNN (see packs_bf16); for `packed_linear` only."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., in] with the weight as `pack_weight` made it."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return y.view(*x.shape[:-1], out_features)


def zerogpu_space() -> bool:
    """Whether the Space says it has a ZeroGPU: SPACES_ZERO_GPU read as the spaces package reads it (1, t or true,
    any case; `spaces.config`, checked in spaces 0.51), so that "0" or "false" mean no."""
    return os.environ.get("SPACES_ZERO_GPU", "").strip().lower() in ("1", "t", "true")


def upload_ids(ids: list[int], device: torch.device) -> torch.Tensor:
    """`ids` as a long tensor on `device`. On CUDA the copy leaves from pinned memory and does not wait: a copy from
    pageable memory (`torch.tensor(ids, device=...)`) synchronizes with the GPU, a second sync in a round whose one
    read is the verdict. The caching host allocator keeps the pinned block until the copy is done."""
    if device.type != "cuda":
        return torch.tensor(ids, dtype=torch.long, device=device)
    return torch.tensor(ids, dtype=torch.long, pin_memory=True).to(device, non_blocking=True)


def requested_dtype(role: str, explicit=None, both=None) -> torch.dtype | None:
    """The dtype asked for a role: the argument, else the argument for both roles, else SPECDEMO_<ROLE>_DTYPE,
    else SPECDEMO_DTYPE; None means automatic (pick_dtype)."""
    for value, what in ((explicit, f"{role} dtype"), (both, "dtype"),
                        (os.environ.get(f"SPECDEMO_{role.upper()}_DTYPE"), f"SPECDEMO_{role.upper()}_DTYPE"),
                        (os.environ.get("SPECDEMO_DTYPE"), "SPECDEMO_DTYPE")):
        dt = parse_dtype(value, what)
        if dt is not None:
            return dt
    return None



@functools.lru_cache(maxsize=8)
def memory_bytes(device: torch.device) -> int:
    """The memory models on `device` can use: a GPU's own memory; on the CPU the machine's RAM, or the container's
    cgroup limit where that is lower (a Space's 16 GB, not its host's)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def model_budget_bytes(device: torch.device) -> int:
    """The memory that model pairs on `device` may take together: SPECDEMO_MODEL_MEMORY_MB megabytes (10^6 bytes)
    where the operator sets it, else half the device's memory. models.load_pair counts every pair against it: the
    pairs in its LRU, the loads in progress, and evicted pairs that a run still holds."""
    from specdemo.config import env_int

    set_mb = env_int("SPECDEMO_MODEL_MEMORY_MB", 0)
    return set_mb * 1_000_000 if set_mb > 0 else memory_bytes(device) // 2


def default_max_params_m(device: torch.device | None = None) -> int:
    """The largest custom model a visitor may load when SPECDEMO_MAX_PARAMS_M is not set, in millions of parameters:
    the LRU's SPECDEMO_MAX_PAIRS pairs of two models that size must fit in the models' memory budget
    (model_budget_bytes: half the device's memory), at 2 bytes a parameter on a GPU and 4 on a CPU (where weights
    may pass through float32 while they load). A 16 GB CPU Space gets 500 M; an 80 GB GPU about 5,000 M."""
    from specdemo.config import env_int

    device = device or pick_device()
    per_param = 2 if device.type in ("cuda", "mps") else 4
    pairs = max(1, env_int("SPECDEMO_MAX_PAIRS", 2))
    return int(model_budget_bytes(device) / (per_param * 2 * pairs) / 1e6)


MAX_TREE_NODES = 64  # the most nodes any tree may have, SPECDEMO_MAX_TREE included: a static cache keeps room for
#                      this many rows and the token before them after its window (models/static.py)


def default_max_tree(device: torch.device | None = None) -> int:
    """The most nodes a draft tree may have when SPECDEMO_MAX_TREE is not set. A target forward over n new tokens
    costs about 1.4 one-token steps at n = 16 and 2.6 at n = 64 on a 2-core CPU (issue 24's calibration), so a CPU
    allows 32 nodes, where a tree is already slower than a chain; a GPU, where a verify of 64 is close to free,
    allows 64 (EAGLE-2's own default is 60)."""
    device = device or pick_device()
    return 64 if device.type in ("cuda", "mps") else 32
