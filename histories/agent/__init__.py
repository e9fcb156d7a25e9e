"""The agent that makes and continues histories: mini-swe-agent's loop stopped at a fork
(`loop`), its model on our streaming client (`chat`), one run's setting (`episode`), the task
workspace (`workspace`) and its box (`sandbox`, with its allowlist view `view`, seccomp filter
`seccomp`, totals `totals` and output reader `streams`), patch capture from the host side
(`capture`), acquisition up to a fork (`acquisition`), a continuation from a fork
(`continuation`) and the chat-template render audit (`audit`)."""
