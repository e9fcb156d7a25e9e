"""Agent tasks: task specifications and where their data lives (`task`), the study's decision
tasks served deterministically (`decision`) and how a model's reply becomes a decision action
(`decision_protocol`). Task data (task.toml, workspaces, tasks.json) is under `data/`."""
