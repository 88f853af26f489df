"""Shared fixtures: the embedded Shakespeare pair (loaded offline, once per process) and tiny toy pairs with an
8-token vocabulary whose exact distributions can be enumerated. All models are real transformers models loaded through
specdemo.models.load_pair, the same path the app uses. Also how many pytest-xdist workers a run gets and how many torch
threads each of them uses."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import pytest


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# pytest.ini runs the suite over pytest-xdist workers (-n auto: pytest_xdist_auto_num_workers below). Each worker gets
# its share of the cores for torch, and so do the processes it starts (the CLI, app.py): with more torch threads than
# cores the threads spin against each other. On this 2-core machine, busy, an EAGLE chi-square test took 210 s of CPU
# with two threads and 18 s with one (2026-11-25). Set before torch is imported, so that OpenMP reads it.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ["OMP_NUM_THREADS"] = str(max(1, cpu_cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_xdist_auto_num_workers(config):
    """-n auto: one worker per core, at most 4 (each loads its own pairs and serves its own app); one process (no
    workers) when the run is narrowed to some tests with -k or a test id, where starting workers costs more than it
    saves. PYTEST_XDIST_AUTO_NUM_WORKERS or an explicit -n still decide."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if config.option.keyword or any("::" in arg for arg in config.args):
        return 0
    return min(4, cpu_cores())


def pytest_report_header(config):
    """The machine kind every result depends on, at the top of each run's log (issue 39: bf16 sums differ between
    AMX and AVX-512 BF16, so a CI result is reported with its CPU kind)."""
    from specdemo.models.devices import cpu_bf16_kind, packs_bf16

    model = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    kind = {"amx": "AMX", "avx512_bf16": "AVX-512 BF16, no AMX", "none": "no bf16 units"}[cpu_bf16_kind()]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (f"specdemo machine: {model}, {cpu_cores()} cores; bf16 units: {kind}; bf16 linears packed: "
            f"{'yes' if packs_bf16(torch.device('cpu'), torch.bfloat16) else 'no'}; torch {torch.__version__}; "
            f"CUDA: {gpu}")


# The modules whose tests take tens of seconds each (chi-square samples, SmolLM2 runs, the app and the CLI in
# processes of their own) run first and the many short tests last: under xdist the run ends when the last test to
# start does, and in a run of 2026-11-25 one worker waited 100 s for the adaptive stop rule's chi-square test.
LONG_FIRST = ("test_smollm2.py", "test_tree.py", "test_exactness.py", "test_eagle.py", "test_browser.py", "test_cli.py",
              "test_public_space.py", "test_app.py", "test_engine.py", "test_first_screen.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))  # stable: a module keeps its order
    if not torch.cuda.is_available():  # the `cuda` marker (pytest.ini): run where there is a CUDA device
        skip = pytest.mark.skip(reason="needs a CUDA device (python3 -m pytest -m cuda on a GPU machine)")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The tests that start the app or call the API without naming a pair are written for the fast Shakespeare pair; the
# shipped default (smollm2-135m) has a test of its own, in a process without this setting (test_browser.py).
os.environ.setdefault("SPECDEMO_DEFAULT_PAIR", "shakespeare")

from specdemo.models import load_pair  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
# headless Chromium and free ports, as scripts/measure_app.py and scripts/screenshot.py use them
from measure_app import ARGS as CHROMIUM_ARGS  # noqa: E402,F401
from measure_app import CHROMIUM, free_port

TOY_WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


def make_toy_model(path, seed: int, n_layer: int = 1, n_embd: int = 32, scale: float = 8.0) -> None:
    """Save a random GPT-2 with an 8-word vocabulary and varied, peaked next-token distributions (an untied,
    scaled-up output head: with tied embeddings every random model mostly repeats its last token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(TOY_WORDS)}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="a")
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(TOY_WORDS), n_positions=32, n_layer=n_layer, n_embd=n_embd, n_head=2,
                        bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.save_pretrained(path)
    fast.save_pretrained(path)


@pytest.fixture(scope="session")
def toy_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    make_toy_model(root / "draft", seed=1)
    make_toy_model(root / "target", seed=2, n_layer=2)
    return root / "draft", root / "target"


@pytest.fixture(scope="session")
def toy_pair(toy_dirs):
    return load_pair((str(toy_dirs[0]), str(toy_dirs[1])), device="cpu")


@pytest.fixture(scope="session")
def pair():
    """The embedded pair as the app loads it: each model in the dtype picked for its role on this machine."""
    return load_pair("shakespeare", device="cpu")


@pytest.fixture(scope="session")
def pair32():
    """The embedded pair with both models in float32, where every forward shape rounds alike to 1e-7, so greedy
    identity with transformers holds token for token."""
    return load_pair("shakespeare", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def self_pair():
    """The embedded target drafting for itself: every draft must be accepted. float32, so that a one-token draft
    step and a (K+1)-token verify give the same numbers (in bf16 they round differently)."""
    from specdemo.config import EMBEDDED_TARGET

    return load_pair((str(EMBEDDED_TARGET), str(EMBEDDED_TARGET)), device="cpu", dtype="float32")


COPY_PROMPTS = [  # prompts on which copying pays: repeat, edit or answer from a quoted passage
    "ROMEO:\nBut, soft! what light through yonder window breaks? It is the east, and Juliet is the sun.\n"
    "JULIET:\nSay it again: But, soft! what light through yonder window breaks?",
    "HAMLET:\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
    "HORATIO:\nMy lord, you said: To be, or not to be, that is the question:\n",
]

PROMPTS = [
    "ROMEO:\n",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n",
    "KING RICHARD III:\nNow is the winter of our discontent\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "MACBETH:\nIs this a dagger which I see before me,\n",
    "PORTIA:\nThe quality of mercy is not strain'd,\n",
    "BRUTUS:\n",
    "OTHELLO:\nIt is the cause, it is the cause, my soul,\n",
    "PROSPERO:\nOur revels now are ended.",
    "LEAR:\nBlow, winds, and crack your cheeks!",
    "HAMLET:\nTo be, or not to be",
    "CLEOPATRA:\nGive me my robe,",
    "DUKE ORSINO:\nIf music be the food of love, play on;",
    "ANTONIO:\nIn sooth, I know not why I am so sad:",
    "HELENA:\nHow happy some o'er other some can be!",
    "CORIOLANUS:\nYou common cry of curs!",
    "KING HENRY V:\nOnce more unto the breach, dear friends,",
    "ROSALIND:\n",
    "Second Servant:\nWhat, ho!",
    "The king is dead",
]


@pytest.fixture(scope="session")
def app_url():
    """The real app (app.py's demo) served on a free localhost port for the whole session."""
    import app
    from specdemo.app.ui import launch

    _, url, _ = launch(app.demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(),
                       quiet=True)
    yield url.rstrip("/")
    app.demo.close()


@pytest.fixture
def allow_local(monkeypatch):
    """Let this test's custom ids be folders on the server (SPECDEMO_ALLOW_LOCAL=1; off by default). The server runs
    in this process and reads its limits per request, so the setting holds for this test only."""
    monkeypatch.setenv("SPECDEMO_ALLOW_LOCAL", "1")


@pytest.fixture(scope="session")
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium driven by Playwright, one per test module (skips where it is not installed)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()
