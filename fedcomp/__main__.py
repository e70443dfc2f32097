from fedcomp.cli import main

raise SystemExit(main())
