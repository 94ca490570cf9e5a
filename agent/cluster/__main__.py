"""`python -m agent.cluster ...`: see agent.cluster.cli."""

import sys

from agent.cluster.cli import main

sys.exit(main())
