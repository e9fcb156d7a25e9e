"""History files and what is inside them: the file format and its validation (`history`),
reasoning blocks inside assistant messages (`reasoning`), the action syntax (`actions`), the
reasoning-only invariant between two requests (`invariant`), export to mini-swe-agent and
importers of other agents' records (`importers/`)."""
