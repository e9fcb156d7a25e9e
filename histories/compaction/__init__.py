"""The study's compaction: the compactor and its rules (`compactor`), the compressor endpoint
(`endpoint`), frozen prompts (`prompts/`), compaction at the fork (`arms`), the fidelity judge
and gate (`checks`), lexical diagnostics (`lexical`), the rewrite ledger (`ledger`) and secret
redaction for external compressors (`redaction`)."""
