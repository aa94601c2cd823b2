"""`python -m app.extract --help`."""

from __future__ import annotations

import sys

from app.extract.main import main

sys.exit(main())
