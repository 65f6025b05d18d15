from bench.soak.run import main

raise SystemExit(main())
