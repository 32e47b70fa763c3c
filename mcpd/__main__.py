from mcpd.cli import main

raise SystemExit(main())
