"""Measure the app as a visitor meets it: seconds until `python app.py` serves its first page (started twice, so
the second start has warm caches), and seconds from pressing Generate to the first streamed round on the default
pair, in headless Chromium. A measurement, not a test: it prints the numbers for the README.

    .venv/bin/python scripts/measure_app.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port: int) -> tuple[subprocess.Popen, float]:
    """Start app.py; -> (process, seconds until GET / answers 200)."""
    env = os.environ | {"GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port), "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while time.perf_counter() - t0 < 300:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                if r.status == 200:
                    return proc, time.perf_counter() - t0
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the app did not answer within 300 s")


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
            page.wait_for_selector("#sd-token-view .sd-tok", timeout=60000)
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
        proc, serve_s = start(port)
        print(f"{attempt}: first page served after {serve_s:.1f} s", flush=True)
        if attempt.startswith("second"):
            times = first_round_s(f"http://127.0.0.1:{port}/", args.runs)
            print("Generate -> first streamed round: " + ", ".join(f"{t:.2f} s" for t in times))
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
