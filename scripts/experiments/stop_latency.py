"""Stop on the page, timed, in one or more checkouts side by side: for each, the app is started from that checkout
and a headless Chromium page runs a long Generate (the Shakespeare pair, 256 tokens, K = 1), presses Stop a few
rounds in, and at once presses Generate again the moment it is live, as a quick hand would. Prints, per checkout,
the seconds from Stop to the buttons' coming back and to the stats' "Stopped", and in how many tries the next run
streamed with Stop live to its end (docs/decisions.md, "Stop ends the run itself"). A measurement, not a test:
  .venv/bin/python scripts/experiments/stop_latency.py --tries 5 /tmp/old-checkout .
`--load N` runs N more pages' Generates alongside, from another browser context, to load the server."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure_app import ARGS, CHROMIUM, free_port, start  # noqa: E402

# Stop, then Generate as soon as it is live; resolves with the times (ms after Stop) and what the buttons did
STOP_JS = """() => new Promise((resolve) => {
  const go = () => document.querySelector('#sd-generate'), stop = () => document.querySelector('#sd-stop');
  const stats = () => document.querySelector('#sd-stats').innerText;
  const reply = () => document.querySelector('#sd-token-view').innerText;
  const t0 = performance.now(), out = {back: null, stopped: null, seen: []};
  const look = () => {
    const t = performance.now() - t0;
    if (out.stopped === null && /Stopped/.test(stats())) out.stopped = t;
    if (out.back === null && !go().disabled) { out.back = t; go().click(); }
    else if (out.back !== null && (go().disabled || out.seen.length))  // from the next run's start
      out.seen.push([go().disabled, stop().disabled, /done/.test(stats()) && !/ROMEO/.test(reply())]);
    if (out.seen.length && out.seen[out.seen.length - 1][2] && !go().disabled) { watch.disconnect(); resolve(out); }
  };
  const watch = new MutationObserver(look);
  watch.observe(document.body, {subtree: true, attributes: true, childList: true, characterData: true});
  stop().click();
  setTimeout(() => { watch.disconnect(); resolve(out); }, 120000); })"""


def trial(page) -> dict:
    page.locator("#sd-prompt textarea").fill("ROMEO:\n")
    page.click("#sd-generate")
    page.wait_for_function("document.querySelectorAll('#sd-token-view .sd-tok').length > 4"
                           " && !/done/.test(document.querySelector('#sd-stats').innerText)", timeout=60000)
    page.locator("#sd-prompt textarea").fill("JULIET:\n")  # read by the next run, not by the running one
    out = page.evaluate(STOP_JS)
    live = [i for i, (go_off, stop_off, _) in enumerate(out["seen"]) if go_off and not stop_off]
    out["stop_live"] = bool(live) and all(done for _, off, done in out["seen"][live[0]:] if off)
    page.wait_for_function("!document.querySelector('#sd-generate').disabled", timeout=180000)
    return out


def measure(root: Path, tries: int, load: int) -> list[dict]:
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc, _ = start(port, root=root)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            others = [browser.new_page() for _ in range(load)]
            page = browser.new_page(viewport={"width": 1500, "height": 1500})
            for pg in [page, *others]:
                pg.goto(f"http://127.0.0.1:{port}/")
                pg.wait_for_selector("#sd-generate")
            page.locator("#sd-settings .label-wrap").click()
            for elem, value in (("sd-max-new", 256), ("sd-k", 1)):
                box = page.locator(f"#{elem} input[type=number]")
                box.fill(str(value))
                box.press("Enter")
            out = []
            for _ in range(tries):
                for pg in others:  # their runs go on while this page's is stopped
                    pg.evaluate("document.querySelector('#sd-generate').click()")
                out.append(trial(page))
            browser.close()
    finally:
        proc.kill()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="+", type=Path, help="checkouts to serve, one after another")
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--load", type=int, default=0, help="other pages generating alongside")
    args = ap.parse_args()
    for root in args.roots:
        got = measure(root.resolve(), args.tries, args.load)
        back = [g["back"] / 1000 for g in got if g["back"] is not None]
        stopped = [g["stopped"] / 1000 for g in got if g["stopped"] is not None]
        print(f"{root}: Stop to buttons back: median {statistics.median(back):.2f} s (max {max(back):.2f}); "
              f"to 'Stopped': median {statistics.median(stopped) if stopped else float('nan'):.2f} s "
              f"({len(stopped)} of {len(got)}); next run with Stop live to its end: "
              f"{sum(g['stop_live'] for g in got)} of {len(got)}")
        for g in got:
            if not g["stop_live"]:  # what the buttons did: (Generate off, Stop off, the stats say done) at each change
                print(f"  not live: back {g['back']} ms, stopped {g['stopped']} ms, seen {g['seen']}")


if __name__ == "__main__":
    main()
