from .client import main

raise SystemExit(main())
