"""transformers' compiled target-only row (`hf generate static compiled`, hf_rows.CompiledGenerate) in a process of
its own (issue 45): on the H200 its compile in the bench's process broke the project's next captured forward
(`CUBLAS_STATUS_EXECUTION_FAILED`), and it compiles again for every new prompt length.

The bench (`CompiledApart.warm_up`) starts `python -m specdemo.bench.compiled_apart` with a job on stdin: the pair
(name, device, dtypes), the sampling, the token budget and every (prompt, seed) the race will ask for. The child
loads the pair eagerly, warms the compiled generate up on each distinct prompt length (two calls each; the first
holds that length's compile, whose seconds are reported apart), then times every (prompt, seed) once, between
synchronisations, and prints one JSON object. The race then reads the row's (tokens, seconds) from it
(`result`): the row is timed in its own process before the race, not interleaved with the others.
"""

from __future__ import annotations

import json
import subprocess
import sys

from specdemo.config import SamplingConfig
from specdemo.models import ModelPair
from specdemo.models.devices import dtype_name


class CompiledApart:
    """The compiled row's results from its own process; the interface that strategies.method_runner reads."""

    def __init__(self, pair: ModelPair, timeout_s: float = 1800):
        self.pair, self.timeout_s = pair, timeout_s
        self.results: dict[tuple[str, int], tuple[int, float]] = {}
        self.info: dict = {}
        self.error: str | None = None

    def job(self, runs: list[tuple[str, int]], sampling: SamplingConfig, max_new_tokens: int) -> dict:
        p = self.pair
        return {"pair": p.name, "device": str(p.device), "target_dtype": dtype_name(p.dtype),
                "draft_dtype": dtype_name(p.draft_dtype), "temperature": sampling.temperature,
                "top_k": sampling.top_k, "top_p": sampling.top_p, "max_new_tokens": max_new_tokens,
                "runs": [list(r) for r in dict.fromkeys(runs)]}

    def warm_up(self, runs: list[tuple[str, int]], sampling: SamplingConfig, max_new_tokens: int, log=print) -> bool:
        """Run the child on every (prompt, seed) of `runs`; False (with `error`) where it fails or times out."""
        job = json.dumps(self.job(runs, sampling, max_new_tokens))
        try:
            done = subprocess.run([sys.executable, "-m", "specdemo.bench.compiled_apart"], input=job, text=True,
                                  capture_output=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            self.error = f"timed out after {self.timeout_s:.0f} s"
        else:
            if done.returncode == 0:
                out = json.loads(done.stdout.strip().splitlines()[-1])
                self.info = out["info"]
                self.results = {(r["prompt"], r["seed"]): (r["tokens"], r["seconds"]) for r in out["runs"]}
                self.error = out["info"].get("error")
            else:
                self.error = f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:200]}"
        if self.error or not self.results:
            log(f"hf generate static compiled (own process): {self.error or 'no result'}; the row is left out")
            return False
        lengths = ", ".join(f"{n} tokens {s:.1f} s" for n, s in self.info["compile_s_by_length"].items())
        log(f"hf generate static compiled (own process): compile per prompt length: {lengths}; timed runs "
            f"{len(self.results)}")
        return True

    def result(self, prompt: str, seed: int) -> tuple[int, float]:
        return self.results[prompt, seed]

    def describe(self) -> dict:
        return self.info | {"own_process": True, "error": self.error}


def child() -> None:
    """The process of its own: read the job, warm each prompt length up, time every run, print JSON."""
    from specdemo.bench.hf_rows import CompiledGenerate, hf_generate
    from specdemo.engine.speculative import encode_prompt
    from specdemo.models.loading import load_pair_uncached

    job = json.loads(sys.stdin.read())
    pair = load_pair_uncached(job["pair"], device=job["device"], draft_dtype=job["draft_dtype"],
                              target_dtype=job["target_dtype"], decoding="eager")
    sampling = SamplingConfig(temperature=job["temperature"], top_k=job["top_k"], top_p=job["top_p"])
    budget, runs = job["max_new_tokens"], [tuple(r) for r in job["runs"]]
    compiled = CompiledGenerate(pair)
    by_length: dict[int, str] = {}
    for prompt, _ in runs:
        by_length.setdefault(len(encode_prompt(pair, prompt, budget)), prompt)
    compile_s = {}
    for n, prompt in sorted(by_length.items(), reverse=True):  # the longest first: transformers keeps its cache
        if not compile_s:  # the first length compiles (and picks fullgraph); later ones reuse that config
            if not compiled.warm_up(pair, [prompt], sampling, budget, calls=2,
                                    log=lambda m: print(m, file=sys.stderr)):
                print(json.dumps({"info": compiled.describe(), "runs": []}))
                return
            compile_s[n] = compiled.warmup_s[0]
        else:
            compile_s[n] = [hf_generate(pair, prompt, sampling, budget, 0, compiled)[1] for _ in range(2)][0]
    timed = []
    for prompt, seed in runs:
        n, secs = hf_generate(pair, prompt, sampling, budget, seed, compiled)
        timed.append({"prompt": prompt, "seed": seed, "tokens": n, "seconds": secs})
    info = compiled.describe() | {"compile_s_by_length": compile_s, "compile_s": sum(compile_s.values())}
    print(json.dumps({"info": info, "runs": timed}))


if __name__ == "__main__":
    child()
