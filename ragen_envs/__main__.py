"""``python -m ragen_envs`` runs the demo (see :mod:`ragen_envs.demo`)."""

import sys

from ragen_envs.demo import main

sys.exit(main())
