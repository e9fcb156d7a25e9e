"""Agent histories: tasks, acquisition up to a fork, history files and their transformations.

mini-swe-agent prints a banner when first imported unless told not to; every module here may
import it, so the switch is set once, before any of them runs.
"""

import os

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
