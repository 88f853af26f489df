"""Seconds to the app's first page and to the first streamed round in headless Chromium (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's (scripts/setup.sh --dev installs it)
# headless Chromium's flags for every page this project opens: scripts/screenshot.py and the tests import them
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port: int, env: dict | None = None, root: Path = ROOT) -> tuple[subprocess.Popen, float]:
    """Start root's app.py (default: this checkout's) on 127.0.0.1:port with `env` (default: this process's
    environment); -> (process, seconds until GET / answers 200). An app that exits first, or serves nothing within
    300 s, raises RuntimeError (with the tail of its stderr, which goes to a temporary file: a pipe nobody reads
    would stall a chatty app)."""
    env = (os.environ if env is None else env) | {"GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
                                                   "HF_HUB_OFFLINE": "1"}
    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=err)
    while time.perf_counter() - t0 < 300:
        if proc.poll() is not None:
            err.seek(0)
            tail = err.read()[-2000:].decode(errors="replace")
            raise RuntimeError(f"app.py exited with status {proc.returncode} before serving a page: {tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                if r.status == 200:
                    return proc, time.perf_counter() - t0
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("app.py served no page within 300 s")


def first_round_s(url: str, runs: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1500})
        page.goto(url)
        page.wait_for_selector("#sd-generate")
        for _ in range(runs):
            t0 = time.perf_counter()
            page.click("#sd-generate")
            # the first streamed round replaces what was on screen (the recorded run the page opens on, or the last)
            page.wait_for_function("!document.querySelector('#sd-stats .sd-recorded') && document.querySelector("
                                   "'#sd-stats').innerText.includes('running')", timeout=60000)
            out.append(time.perf_counter() - t0)
            page.wait_for_function("document.querySelector('#sd-stats').innerText.includes('done')", timeout=300000)
        browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="Generate presses timed on the second start")
    args = ap.parse_args()
    for attempt in ("first start", "second start (warm caches)"):
        port = free_port()
        try:
            proc, serve_s = start(port)
        except RuntimeError as e:
            raise SystemExit(str(e)) from None
        print(f"{attempt}: first page served after {serve_s:.1f} s", flush=True)
        if attempt.startswith("second"):
            times = first_round_s(f"http://127.0.0.1:{port}/", args.runs)
            print("Generate -> first streamed round: " + ", ".join(f"{t:.2f} s" for t in times))
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
