"""Redaction on detect-secrets' detectors plus our rules: the issue's list, look-alikes, the
labelled corpus at the figures measured on it, and properties over arbitrary text."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from compaction_bench.histories.compaction.redaction import redact, restore, scan
from compaction_bench.histories.compaction.redaction_bench import (
    SPLITS,
    CorpusError,
    default_corpus,
    evaluate,
    is_found,
    load_corpus,
)
from compaction_bench.histories.compaction.redaction_rules import RedactionRulesError, load_rules

# Fake credentials in the shapes the issue lists (random characters; never real).
ISSUE_CASES = [
    ("Stripe key sk_live_4eC39HqLyjWDarjtT1zdp7dcXYZ12345abcdef for the test charge.",
     "sk_live_4eC39HqLyjWDarjtT1zdp7dcXYZ12345abcdef"),
    ("git clone https://oauth2:glpat-xT4kq8Yb2Lm9NpQr7sVw@gitlab.com/g/r.git",
     "glpat-xT4kq8Yb2Lm9NpQr7sVw"),
    ("publishing with npm_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5 from CI",
     "npm_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5"),
    ("the metadata server returned ya29.a0AfH6SMBx3kT9qL2mNpR7sVw4yZ1cE8fG0hJ (3599 s)",
     "ya29.a0AfH6SMBx3kT9qL2mNpR7sVw4yZ1cE8fG0hJ"),
    ("alerts go to https://hooks.slack.com/services/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",
     "https://hooks.slack.com/services/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"),
    ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MG"
     "FiY2RlZg==;EndpointSuffix=core.windows.net",
     "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZg=="),
    ("cat key.pem printed\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx7qL2mNpR7sVw4yZ1cE"
     "8fG0\nbPxRfiCYEXAMPLEKEYwJalrXUtnFEMIK7MDENG\n[output truncated]",
     "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx7qL2mNpR7sVw4yZ1cE8fG0\n"
     "bPxRfiCYEXAMPLEKEYwJalrXUtnFEMIK7MDENG"),
    ("docker login --password x registry.example.com", "x"),
    ("mysql -u root -pX shop < dump.sql", "X"),
    ("curl -u user:pw https://api.example.com/v1/users", "pw"),
    ("DB_PASS=swordfish ./manage.py migrate", "swordfish"),
    ('password: "correct horse battery staple"', "correct horse battery staple"),
]


@pytest.mark.parametrize(("text", "secret"), ISSUE_CASES, ids=[c[1][:12] for c in ISSUE_CASES])
def test_the_issues_misses_are_redacted_whole_and_restored(text: str, secret: str) -> None:
    got = redact(text)
    assert secret in got.secrets, f"redacted {got.secrets} instead"
    assert is_found(text, secret, scan(text))
    assert "[REDACTED-SECRET-1]" in got.text
    assert restore(got.text, got) == (text, got.count)


# The cases redaction covered before it was rebuilt on detect-secrets: they must keep holding.
@pytest.mark.parametrize("secret", [
    "OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuv",
    "export GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123",
    "password: hunter22",
    '"client_secret": "s3cr3t-value"',
    "Authorization: Bearer abcdefghijklmnopqrstuvwxyz",
    "postgres://admin:pa55word@db:5432/app",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
    "AWS key AKIAABCDEFGHIJKLMNOP",
])
def test_the_earlier_cases_are_still_redacted_and_restored(secret: str) -> None:
    text = f"Config check: {secret} then run the tests."
    got = redact(text)
    assert got.count >= 1 and "[REDACTED-SECRET-1]" in got.text
    for value in got.secrets:
        assert value not in got.text
    assert restore(got.text, got) == (text, got.count)


LOOKALIKES = [
    "max_tokens = 256 and tokens = 12; the password field is empty; risk <= 0.05",
    "see VAX-28 and VAX-31 before the release",
    "password_field = form.get('password')",
    "password = getpass.getpass()",
    "if password == confirm_password:",
    "commit 3f786850e387550fdab836ed7e6dc881de23001b",
    "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "request 550e8400-e29b-41d4-a716-446655440000 finished",
    "/work/main/.venv/lib/python3.11/site-packages/detect_secrets/plugins/keyword.py",
    "PWD=/work/wt-fuzz", "vllm==0.32.1 torch 2.13.0+cpu",
    "model HuggingFaceTB/SmolLM2-135M-Instruct",
    "mysql -u root -p shop", 'curl -u "$USER:$PASS" https://api.example.com',
    "DB_PASSWORD=$(cat /run/secrets/db)", "Password: must contain at least one digit.",
    '"eos_token": "<|im_end|>"', "PASSWORD_MIN_LENGTH = 12",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIb36rmzPzZaesyru45vDtM51K5Aa0P8hGrqc9XqoRS1D a@b",
]


@pytest.mark.parametrize("text", LOOKALIKES)
def test_look_alikes_are_left_alone(text: str) -> None:
    got = redact(text)
    assert (got.text, got.count) == (text, 0), got.secrets


def test_the_same_value_gets_the_same_placeholder_wherever_it_recurs() -> None:
    text = ("export DB_PASS=Zq8vLm2Rt5 and HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh; "
            "later the log echoed Zq8vLm2Rt5 again")
    got = redact(text)
    assert got.secrets == ("Zq8vLm2Rt5", "hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh")
    assert got.text == ("export DB_PASS=[REDACTED-SECRET-1] and HF_TOKEN=[REDACTED-SECRET-2]; "
                        "later the log echoed [REDACTED-SECRET-1] again")
    assert restore(got.text, got) == (text, 3)


def test_placeholders_already_in_the_text_are_kept() -> None:
    text = "password: [REDACTED-SECRET-1] and api_key = 'Qx7Rt4Vb1Nz6Wc3Yd5Lm'"
    got = redact(text)
    assert got.secrets == ("Qx7Rt4Vb1Nz6Wc3Yd5Lm",)
    assert got.text.startswith("password: [REDACTED-SECRET-1] and")


# Measured with `python -m compaction_bench.histories.compaction.redaction_bench` on the shipped
# corpus (see
# data/redaction/README.md): dev 122/122 found, 0/131 look-alikes redacted; holdout-1 46/47,
# 0/49; holdout-2 33/34, 0/40. The thresholds sit at those figures, so losing a single secret
# or redacting a single look-alike fails here.
MEASURED = {"dev": (122, 122, 0), "holdout-1": (46, 47, 0), "holdout-2": (33, 34, 0)}


@pytest.mark.parametrize("split", SPLITS)
def test_corpus_recall_and_false_positives_hold_at_the_measured_figures(split: str) -> None:
    entries = [e for e in load_corpus(default_corpus()) if e.split == split]
    scores = evaluate(entries)
    found, present, false_positive_texts = MEASURED[split]
    assert scores.present == present
    assert scores.found >= found, scores.misses
    assert len({i for i, _ in scores.false_positives}) <= false_positive_texts, (
        scores.false_positives)


@pytest.mark.e2e
def test_the_benchmark_prints_recall_and_false_positive_rate() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    out = subprocess.run([sys.executable, "-m", "compaction_bench", "measure", "redaction",
                          "--repeat", "1", "--show", "0"], capture_output=True, text=True,
                         env=env, timeout=120, check=True).stdout
    assert "recall: 122/122 = 100.0%" in out and "== holdout-2 split ==" in out
    assert "false-positive rate: 0/40 look-alike texts with a redaction = 0.0%" in out


def test_a_bad_corpus_line_names_the_file_line_and_field(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "kind": "k", "text": "x", "secrets": ["y"], "split": "dev"}\n')
    with pytest.raises(CorpusError, match=r"corpus.jsonl line 1: field 'secrets' names 'y'"):
        load_corpus(corpus)


def test_a_bad_rules_file_names_the_file_and_field(tmp_path: Path) -> None:
    good = Path(__file__).resolve().parents[3] / "histories/compaction/redaction_rules.toml"
    broken = tmp_path / "rules.toml"
    broken.write_text(good.read_text().replace("kind = \"stripe\"", "kind = \"stripe\"\nflags = 1"))
    with pytest.raises(RedactionRulesError, match=r"rules.toml: .*rule\.\d+\.flags"):
        load_rules(broken)
    broken.write_text(good.read_text().replace("(?<![\\w-])npm_", "(?<![\\w-]npm_"))
    with pytest.raises(RedactionRulesError, match="not a valid regular expression"):
        load_rules(broken)
    broken.write_bytes(b"\xff\xfe")
    with pytest.raises(RedactionRulesError, match="not UTF-8"):
        load_rules(broken)


# --- properties ------------------------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=400)
# Fragments of the shapes the rules look for, glued in any order: the patterns' worst cases.
_SHELLISH = st.lists(st.sampled_from(
    [*"aA1_-./=:\"' \n$@<>{}[]()!#%&*+,;?", "password", "token", "secret", "api_key",
     "--password ", "-p", "curl -u ", "mysql ", "BEGIN RSA PRIVATE KEY", "-----", "Bearer ",
     "AKIA", "ghp_", "sk-", "xoxb-", "eyJ", "Zq8vLm2Rt5Qx7Rt4Vb1N"]), max_size=60).map("".join)


@settings(max_examples=3 * settings.default.max_examples)  # cheap: 300 in the default run
@given(st.one_of(_TEXT, _SHELLISH))
@example("password=" * 200)
@example("--" + "a-" * 2000 + " x")
@example("-----BEGIN RSA PRIVATE KEY-----" * 100)
@example("BEGIN RSA PRIVATE KEY:BEGIN RSA PRIVATE KEY")  # found by the long run (the test's own
                                                        # count was wrong: one value, two places)
def test_redaction_round_trips_any_text_and_leaves_no_found_value(text: str) -> None:
    assume("[REDACTED-SECRET-" not in text)
    started = time.perf_counter()
    got = redact(text)
    assert time.perf_counter() - started < 2.0  # no pattern backtracks on hostile text
    # every placeholder comes back (a value found twice is one secret, two placeholders)
    assert restore(got.text, got) == (text, got.text.count("[REDACTED-SECRET-"))
    assert all(value and value in text for value in got.secrets)
    assert len(set(got.secrets)) == got.count
