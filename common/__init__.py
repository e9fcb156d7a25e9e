"""What every part of the suite shares: the error root and exit codes, files written atomically
and appended line by line, the one clock, ports and URLs, where data and results live, the
provenance of a measurement (`provenance`), the one bootstrap convention (`resampling`), Markdown
tables (`markdown`) and stopping a child with everything it started (`processtree`).

Nothing here knows about servers, histories or experiments; every other package may import it.
"""
