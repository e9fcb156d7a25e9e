"""What every part of the suite shares: the error root and exit codes, files written atomically
and appended line by line, the one clock, ports and URLs, and where data and results live.

Nothing here knows about servers, histories or experiments; every other package may import it.
"""
