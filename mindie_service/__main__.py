from mindie_service.cli import main

raise SystemExit(main())
