"""Fuzzing profile files: arbitrary bytes (non-UTF-8 included) and line-level mutations of the
shipped cpu-tiny profile. 0 tracebacks: every file loads or is refused with a `ProfileError`
naming the file (and the field, where the TOML parsed)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import event, example, given
from hypothesis import strategies as st

from compaction_bench.serve.errors import ProfileError
from compaction_bench.serve.profile import PROFILE_DIR, Profile, load_profile

SHIPPED = (PROFILE_DIR / "cpu-tiny.toml").read_text(encoding="utf-8")
# Values a hand-edited profile could hold where another type belongs, and TOML's corner cases.
LITERALS = ['"x"', "-1", "0", "1e309", "inf", "nan", "[]", '[1, "a"]', "{}", "{ a = 1 }", "true",
            "1979-05-27T07:32:00Z", '"\\u0000"', "99999999999999999999999", '"--host=0.0.0.0"',
            '["--port", "9"]', '["--served-model-name", "x"]', '"ü"', "'''multi\nline'''", '""']
EXTRA_LINES = ["[x]", "[engine_args.extra]", 'extra_args = ["--host", "0.0.0.0"]', "name = 1",
               "gpus = -1", "[[model]]", "served_names = []", "= 1", "a.b.c = 2", "\x00"]


@st.composite
def mutated_toml(draw: st.DrawFn, text: str) -> bytes:
    """`text` with one to four lines replaced in value, deleted, duplicated or inserted."""
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(lines) - 1)))
        action = draw(st.sampled_from(["value", "delete", "duplicate", "insert"]))
        if action == "value" and "=" in lines[at]:
            key = lines[at].split("=", 1)[0]
            lines[at] = f"{key}= {draw(st.sampled_from(LITERALS) | st.text(max_size=8))}"
        elif action == "delete" and lines:
            del lines[at]
        elif action == "duplicate" and lines:
            lines.insert(at, lines[at])
        else:
            lines.insert(at, draw(st.sampled_from(EXTRA_LINES) | st.text(max_size=20)))
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        return data
    cut = draw(st.integers(0, len(data)))
    return data[:cut] + draw(st.binary(max_size=4)) + data[cut:]


def load_or_refuse(path: Path) -> Profile | None:
    try:
        profile = load_profile(str(path))
    except ProfileError as exc:
        assert str(path) in str(exc), f"the message does not name the file: {exc}"
        assert "\n" not in str(exc)
        event("refused: " + ("not TOML" if "TOML" in str(exc) else "not UTF-8" if "UTF-8" in
                             str(exc) else "a field"))
        return None
    event("loaded")
    return profile


@given(st.one_of(st.binary(max_size=300), mutated_toml(SHIPPED)))
@example(b"\xff\xfename = 'x'")
@example(SHIPPED.replace("[engine_args]", '[engine_args]\nextra_args = ["--host=0.0.0.0"]')
         .encode())
@example(SHIPPED.replace("max_num_seqs = 4", "max_num_seqs = 1e309").encode())
def test_any_profile_file_loads_or_is_refused_naming_the_file(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_bytes(raw)
    profile = load_or_refuse(path)
    if profile is not None:  # what loads is consistent: the launcher's own flags stay its own
        assert not any(a.split("=", 1)[0] in ("--host", "--port", "--served-model-name")
                       for a in profile.engine_args.extra_args)
        assert profile.regimes.shared_users < profile.engine_args.max_num_seqs
