"""`python -m mcpd.serving LISTEN_FD CHANNEL_FD BLOCK_FD LOG_LEVEL`: the serving process, started
by the governor (mcpd.governor.supervisor); not meant to be run by hand."""

from mcpd.serving.process import main

raise SystemExit(main())
