import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # before torch: see mindie_service/__init__.py

from mindie_service.cli import main  # noqa: E402

raise SystemExit(main())
