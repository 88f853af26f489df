"""The text a chat template puts around one user message, rendered once per pair, and for a template that is not a
preset's, in a forked child process with a time and a memory limit.

A template is code: transformers renders it in jinja's sandbox, which stops what it may touch but neither how long
it runs nor how much it allocates (nested `range` loops; `'x' * 2000000000`). A visitor's custom pair brings its
own, and the page renders it for every chat prompt, outside the run's time limit. The text around the message does
not depend on the message, so it is rendered once, with a marker where the message goes.
"""

from __future__ import annotations

import multiprocessing
import os

from specdemo.i18n import Msg

from .weights import ModelLoadError

MARKER = "\x00specdemo-message\x00"  # where the message goes; a tokenizer never makes this text
RENDER_S = 5.0  # seconds a template that is not a preset's may take to render
RENDER_BYTES = 512 << 20  # the memory it may add to the process's
MAX_TEXT = 1 << 20  # characters the frame may hold


def render(tokenizer) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": MARKER}], add_generation_prompt=True,
                                         tokenize=False)


def frame(tokenizer, trusted: bool, who: str) -> tuple[str, str]:
    """(before, after) the message in `tokenizer`'s chat template. trusted (a preset's template): rendered here;
    otherwise in a child (`bounded`), refused in one sentence (ModelLoadError naming `who`) past its limits."""
    text = render(tokenizer) if trusted else bounded(tokenizer, who)
    if text.count(MARKER) != 1:
        raise ModelLoadError("err.chat_template", model=who, why=Msg("chat.no_message"))
    before, after = text.split(MARKER)
    return before, after


def bounded(tokenizer, who: str) -> str:
    """render(tokenizer) in a forked child with RENDER_S seconds and RENDER_BYTES more memory (RLIMIT_AS over the
    address space it was forked with), its text back through a pipe. Where fork is missing (Windows), here."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return render(tokenizer)
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            import resource

            base = address_space()
            if base:  # (no /proc: no limit but the time)
                resource.setrlimit(resource.RLIMIT_AS, (base + RENDER_BYTES, base + RENDER_BYTES))
            text = render(tokenizer)
            writer.send(("ok", text) if len(text) <= MAX_TEXT else ("big", None))
        except MemoryError:
            writer.send(("memory", None))
        except BaseException as err:  # noqa: BLE001 - whatever the template raised, said by its type
            writer.send(("error", type(err).__name__))
        finally:
            os._exit(0)

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    writer.close()
    try:
        got = reader.recv() if reader.poll(RENDER_S) else ("slow", None)
    except EOFError:  # the child died without a word (killed for its memory)
        got = ("memory", None)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        reader.close()
    kind, value = got
    if kind == "ok":
        return value
    why = {"slow": Msg("chat.slow", s=f"{RENDER_S:g}"), "memory": Msg("chat.memory", mb=RENDER_BYTES >> 20),
           "big": Msg("chat.big")}.get(kind) or Msg("chat.error", error=str(value))
    raise ModelLoadError("err.chat_template", model=who, why=why)


def address_space() -> int:
    """This process's virtual memory size in bytes (VmSize), what RLIMIT_AS measures."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0
