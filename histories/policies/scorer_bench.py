"""What does the proxy scorer cost? Seconds per scoring call on this machine's device.

    python -m compaction_bench.histories.policies.scorer_bench [--repeat 5] [--model ...] [--device
    ...]

One call scores a five-block reasoning text (blocks between blank lines, as the `entropy` arm
splits them) after a history prefix of 0, 20 and 60 tool-result turns, as one call of the
entropy arm does before a request. After one warm-up call per size, `--repeat` calls are
timed (`SegmentScores.scorer_s`: tokenize, forward, entropy, device synchronized); prints the
input tokens and the median, min and max seconds with n. On a CPU shared with the serving
engine the numbers move with its load: repeat and read the median.
"""

from __future__ import annotations

import statistics
from typing import Annotated

import typer

from compaction_bench.common.errors import run_cli
from compaction_bench.histories.policies.scorer import ProxyScorer, ScorerConfig
from compaction_bench.histories.policies.segments import split_segments

app = typer.Typer(add_completion=False)
BLOCK = ("I should read the test file first to see which cases fail, then open stats_utils.py "
         "and look at how the median is computed for even-length lists. ")
TURN = ("<|im_start|>user\n<returncode>0</returncode><output>def median(xs): return "
        "sorted(xs)[len(xs)//2]</output><|im_end|>\n")


@app.command()
def main(repeat: Annotated[int, typer.Option(min=1)] = 5,
         model: str = "embedded:smollm2-135m-instruct",
         device: Annotated[str, typer.Option(help="auto, cpu, cuda, ...")] = "auto") -> None:
    """Time the scorer on three history lengths (module docstring)."""
    scorer = ProxyScorer.shared(ScorerConfig(model=model, device=device))
    described = scorer.describe()
    typer.echo(f"scorer {model} on {described['device']} ({described['dtype']}), entropy "
               f"{described['entropy']}, threads {described.get('threads')}")
    reasoning = "\n\n".join(BLOCK * 2 for _ in range(5))
    segments = split_segments(reasoning)
    for turns in (0, 20, 60):
        prefix = TURN * turns
        scorer.score(prefix, reasoning, segments)  # warm-up: first-call allocations
        calls = [scorer.score(prefix, reasoning, segments) for _ in range(repeat)]
        seconds = [c.scorer_s for c in calls]
        typer.echo(f"{len(segments)} blocks, {calls[0].input_tokens} input tokens: median "
                   f"{statistics.median(seconds):.2f} s (min {min(seconds):.2f}, max "
                   f"{max(seconds):.2f}, n={repeat})")


if __name__ == "__main__":
    run_cli(app)
