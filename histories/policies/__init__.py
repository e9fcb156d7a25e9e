"""History policies, one per arm: given the messages before a request, the messages to send.
The protocol and the reference arm (`base`), continuous compaction during a continuation
(`compacting`), arm names (`registry`), and the one arm-file writer, in which compaction is one
more policy (`armfile`)."""
