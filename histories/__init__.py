"""Agent histories: tasks, acquisition up to a fork, history files and their transformations
(compaction arms). Filled by the histories and compaction issues; nothing here yet."""
